"""The SGLang engine backend: a stage's model served by ``sglang.Engine`` in the stage's process.

The engine is SGLang's (scheduler, paged KV pool, radix cache, CUDA graphs,
kernels); what omni keeps is the seam every stage already uses: ``enqueue``
returns a :class:`SGLangStream` of model outputs, ``abort`` stops a request,
``aclose`` stops the engine. What is model-specific — which checkpoint and
model class SGLang loads, how an omni prompt becomes a ``GenerateReqInput``,
how a streamed chunk becomes the outputs the stage emits — is the model
adapter's (:class:`SGLangModel`), which the plugin supplies.

Lifecycle. SGLang starts its scheduler and detokenizer as child processes of
the stage's process (they die with it: SGLang asks the kernel for a parent
death signal), in a worker thread so the stage's event loop keeps answering
heartbeats during the 10-70 s start. Requests go through SGLang's tokenizer
manager on the stage's event loop: SGLang's ``Engine.generate`` has no
embedding or multimodal-item arguments, its ``GenerateReqInput`` does.

GPU. The only code that differs on a GPU is :func:`device_args`: on the CPU
SGLang needs its torch-native attention and sampling (no kernels here), on
CUDA it picks its own kernels and captures CUDA graphs unless told otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any, Protocol

import anyio

from ..errors import ConfigError, RequestError
from .interface import EngineError, SamplingParams, check_sampling

log = logging.getLogger(__name__)


class SGLangModel(Protocol):
    """What a plugin gives the SGLang backend for one stage."""

    def launch(self) -> tuple[dict[str, Any], dict[str, str]]:
        """``(ServerArgs keys, environment)`` that make SGLang load this stage's model."""
        ...

    def prompt_length(self, prompt: Any) -> int: ...

    def request(self, request_id: str, prompt: Any, sampling: SamplingParams) -> dict[str, Any]:
        """The ``GenerateReqInput`` fields of one request (``rid`` and ``stream`` are set)."""
        ...

    def outputs(self, request_id: str, chunk: dict[str, Any], sent: int) -> list[Any]:
        """The outputs a streamed chunk adds, given ``sent`` tokens already emitted."""
        ...

    def finished(self, request_id: str) -> None:
        """The request ended (for per-request state the adapter keeps)."""
        ...


def device_args(device: str | None) -> dict[str, Any]:
    """ServerArgs that depend on the device: the one GPU/CPU difference of this backend."""
    if device is None or str(device).startswith("cpu"):
        return {
            "device": "cpu",
            "attention_backend": "torch_native",
            "sampling_backend": "pytorch",
            "disable_cuda_graph": True,
            "disable_overlap_schedule": True,
        }
    kind, _, index = str(device).partition(":")
    args: dict[str, Any] = {"device": kind}
    if index:
        args["base_gpu_id"] = int(index)
    return args


def _finish_reason(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    if not reason:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    return {"length": "length", "stop": "stop", "abort": "abort"}.get(str(kind), "stop")


class SGLangStream:
    """One request's outputs; leaving it early (or cancelling its reader) aborts it."""

    def __init__(self, engine: SGLangEngine, request_id: str, prompt: Any, sampling: Any):
        self.request_id = request_id
        self.finish_reason: str | None = None
        self._engine, self._prompt, self._sampling = engine, prompt, sampling
        self._iterator: AsyncIterator[Any] | None = None

    def __aiter__(self) -> SGLangStream:
        return self

    async def __anext__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._run()
        try:
            return await self._iterator.__anext__()
        except anyio.get_cancelled_exc_class():
            self._engine.abort(self.request_id)
            raise

    async def _run(self) -> AsyncIterator[Any]:
        engine = await self._engine.started()
        from sglang.srt.managers.io_struct import GenerateReqInput

        fields = self._engine.model.request(self.request_id, self._prompt, self._sampling)
        request = GenerateReqInput(rid=self.request_id, stream=True, **fields)
        sent = 0
        try:
            async for chunk in engine.tokenizer_manager.generate_request(request, None):
                for output in self._engine.model.outputs(self.request_id, chunk, sent):
                    sent += 1
                    yield output
                reason = _finish_reason(chunk.get("meta_info") or {})
                if reason is not None:
                    self.finish_reason = reason
        except ValueError as exc:  # SGLang's refusal of one request (too long, bad params)
            self.finish_reason = "error"
            raise RequestError(f"SGLang refused request {self.request_id!r}: {exc}") from None
        finally:
            self._engine.model.finished(self.request_id)
            self._engine._requests.discard(self.request_id)
        if self.finish_reason is None:
            self.finish_reason = "stop"

    async def aclose(self) -> None:
        if self.finish_reason is None:
            self._engine.abort(self.request_id)
            self.finish_reason = "abort"
        if self._iterator is not None:
            with contextlib.suppress(Exception):
                await self._iterator.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> SGLangStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class SGLangEngine:
    """``sglang.Engine`` behind omni's engine seam (see the module doc)."""

    def __init__(self, model: SGLangModel, settings: Any, *, device: str | None = None, **_: Any):
        self.model, self.settings, self.device = model, settings, device
        self._engine: Any = None
        self._starting: anyio.Event | None = None
        self._start_error: BaseException | None = None
        self._requests: set[str] = set()
        self._closing = False

    def server_args(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Every ServerArgs key SGLang gets, and the environment (for tests and ``--help``)."""
        launch, env = self.model.launch()
        args = {**device_args(self.device or getattr(self.settings, "device", None))}
        args.update(self.settings.server_args())
        args.update(launch)
        args.setdefault("log_level", "warning")
        return args, env

    async def start(self) -> None:
        await self.started()

    async def started(self) -> Any:
        """The running ``sglang.Engine`` (started on first use, in a worker thread)."""
        if self._engine is not None:
            return self._engine
        if self._closing:
            raise EngineError("the SGLang engine is closed")
        if self._starting is None:
            self._starting = anyio.Event()
            loaded = getattr(self.model, "loaded", None)
            try:
                self._engine = await anyio.to_thread.run_sync(self._launch)
            except BaseException as exc:
                self._start_error = exc
                raise
            finally:
                self._starting.set()
                if loaded is not None:
                    loaded()  # SGLang holds the weights: files written for it can go
        else:
            await self._starting.wait()
        if self._engine is None:
            raise EngineError(f"the SGLang engine did not start: {self._start_error}")
        return self._engine

    def _launch(self) -> Any:
        args, env = self.server_args()
        os.environ.update(env)
        try:
            import sglang
        except ImportError as exc:
            raise ConfigError(
                f'engine.backend = "sglang" needs SGLang, which is not importable here ({exc})',
                hint="build the opt-in environment with `make sglang-env` and serve from "
                ".venv-sglang/bin/omni",
            ) from None
        log.info("starting SGLang %s: %s", sglang.__version__, args)
        return sglang.Engine(**args)

    def enqueue(self, request_id: str, prompt: Any, sampling: SamplingParams | None = None):
        if self._closing:
            raise EngineError("the SGLang engine is closed")
        if request_id in self._requests:
            raise RequestError(f"request {request_id!r} is already in the engine")
        sampling = sampling if sampling is not None else SamplingParams()
        check_sampling(sampling)
        length = self.model.prompt_length(prompt)
        # SGLang chunks a long prompt itself (engine.chunked_prefill_size); what can never
        # fit is the KV pool omni planned for it.
        if length > self.settings.max_total_tokens:
            raise RequestError(
                f"the prompt takes {length} positions; engine.max_total_tokens is "
                f"{self.settings.max_total_tokens}"
            )
        self._requests.add(request_id)
        return SGLangStream(self, request_id, prompt, sampling)

    def abort(self, request_id: str) -> bool:
        if request_id not in self._requests or self._engine is None:
            return False
        self._requests.discard(request_id)
        self._engine.tokenizer_manager.abort_request(rid=request_id)
        return True

    def wake(self) -> None:
        """Nothing waits on omni here: SGLang's scheduler runs on its own."""

    def _load(self) -> tuple[int, int]:
        if self._engine is None:
            return 0, 0
        try:
            loads = self._engine.tokenizer_manager.load_snapshot_reader.read_all()
        except Exception:
            return 0, 0
        running = sum(int(getattr(s, "num_running_reqs", 0)) for s in loads if s is not None)
        waiting = sum(int(getattr(s, "num_waiting_reqs", 0)) for s in loads if s is not None)
        return running, waiting

    @property
    def num_running(self) -> int:
        """Requests in SGLang's running batch (its scheduler's own count)."""
        return self._load()[0]

    @property
    def num_waiting(self) -> int:
        """Requests in SGLang's waiting queue (its scheduler's own count)."""
        return self._load()[1]

    async def aclose(self) -> None:
        self._closing = True
        close = getattr(self.model, "close", None)
        engine, self._engine = self._engine, None
        if engine is not None:
            for request_id in list(self._requests):
                with contextlib.suppress(Exception):
                    engine.tokenizer_manager.abort_request(rid=request_id)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(engine.shutdown)
        if close is not None:
            close()  # the adapter's own files (a dummy checkpoint written for SGLang)

    async def __aenter__(self) -> SGLangEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
