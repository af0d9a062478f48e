"""What every speech plugin's stage factories repeated, in the stage processes.

This module imports no torch at import time (``torch_device`` imports it when
called), but it serves stage factories only, in the processes that run them:

- :func:`torch_device`: the device a stage was placed on, refused clearly
  when the placement asked for a GPU this process cannot see;
- :func:`engine_settings`: an engine stage's ``engine.*`` settings, with the
  placement's memory share as the engine's bound unless
  ``engine.mem_fraction_static`` sets one;
- :func:`engine_factory`: an engine stage's factory declared once: the
  standard parameters the core injects by name (``model_path``, ``gpu_id``,
  ``gpu_memory_fraction``, ``engine_settings``) and the engine stages' own
  ``factory.dtype``/``load_format``/``seed``, handed to the family's
  function as one :class:`EngineContext` (device and settings resolved);
- :func:`tp_group`: a tensor-parallel stage's group, the one the runtime
  formed for this process, or a clear error when there is none;
- :class:`WorkerThreadStage`: a preprocessing stage whose checks (tokenizing,
  decoding a reference clip) run in a worker thread, so a long request cannot
  silence its process's heartbeat; it refuses unknown request fields first;
  :class:`TTSPreprocessing` adds a TTS request's bounds (frames, reference
  clip length, text tokens);
- :func:`number` and :func:`text`: request fields checked by type, each
  mistake a :class:`~omni_core.RequestError` (HTTP 400) naming the field;
  :data:`SPEECH_REQUEST_KEYS`, the fields every TTS request may carry.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, ClassVar

from ..engine.interface import EngineSettings
from ..errors import RequestError

SPEECH_REQUEST_KEYS = frozenset(
    {
        # OpenAI's speech fields
        "model", "input", "voice", "response_format", "speed", "instructions", "stream",
        "stream_format",
        # the server's voices (CONTRIBUTING: "Voices"): an enrollment, a stored clone prompt
        "voice_enroll", "voice_prompt",
        # the sampling every TTS engine reads (the OpenAI-style names) and the frame cap
        "temperature", "top_k", "top_p", "repetition_penalty", "seed", "max_frames",
    }
)  # fmt: skip
"""The request fields every TTS preprocessing stage accepts; a family adds its own."""


def torch_device(gpu_id: int | None, stage: str) -> str:
    """``cuda:<gpu_id>`` for a stage placed on a GPU, ``cpu`` for one placed on none."""
    if gpu_id is None:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"stage {stage!r} was placed on GPU {gpu_id}, but torch sees no CUDA device here; "
            "plan for this machine with --placement.policy cpu"
        )
    return f"cuda:{gpu_id}"


def engine_settings(
    settings: EngineSettings | None, gpu_memory_fraction: float | None
) -> EngineSettings:
    """The engine's settings (validated at planning, defaults filled); the placement's
    share of the GPU bounds weights and cache together unless ``engine.mem_fraction_static``
    says otherwise."""
    settings = settings or EngineSettings()
    if settings.mem_fraction_static is None and gpu_memory_fraction is not None:
        settings = settings.model_copy(update={"mem_fraction_static": gpu_memory_fraction})
    return settings


@dataclass(frozen=True)
class EngineContext:
    """What an engine stage's factory needs from the standard parameters, resolved:
    the device it was placed on and its engine settings under the placement share."""

    stage: str
    model_path: str
    device: str
    settings: EngineSettings
    dtype: str | None
    load_format: str
    seed: int

    @property
    def load_args(self) -> tuple[str, str, str | None, str, int]:
        """``(model_path, load_format, dtype, device, seed)``: the order the families'
        model loaders take (``load_model(*engine.load_args)``)."""
        return (self.model_path, self.load_format, self.dtype, self.device, self.seed)


def _standard(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> Any:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Parameter(name, kind, default=default, annotation=annotation)


ENGINE_PARAMETERS = (
    _standard("model_path", str),
    _standard("gpu_id", int | None, None),
    _standard("gpu_memory_fraction", float | None, None),
    _standard("engine_settings", EngineSettings | None, None),
    _standard("dtype", str | None, None),
    _standard("load_format", str, "auto"),
    _standard("seed", int, 0),
)
"""An engine stage factory's leading parameters, in order: the core injects the
first four by name (``omni_core.factory``), the last three are ``factory.*`` keys."""


def engine_factory(stage: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare an engine stage's factory from ``build(engine: EngineContext, **own)``.

    The decorated factory's signature (what the core reads to inject standard
    kwargs and to refuse unknown ``factory.*`` keys) is :data:`ENGINE_PARAMETERS`
    followed by ``build``'s own parameters (each with a default); a call binds
    them, resolves the device and settings, and hands ``build`` the context.
    """

    def decorate(build: Callable[..., Any]) -> Callable[..., Any]:
        own = list(inspect.signature(build).parameters.values())[1:]
        clash = {p.name for p in own} & {p.name for p in ENGINE_PARAMETERS}
        if clash or any(p.default is p.empty for p in own):
            raise TypeError(
                f"{build.__qualname__}: an engine factory's own parameters need defaults "
                f"and may not repeat the standard ones ({', '.join(sorted(clash)) or 'none'})"
            )
        signature = inspect.signature(build).replace(parameters=[*ENGINE_PARAMETERS, *own])

        @functools.wraps(build)
        def factory(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = bound.arguments
            engine = EngineContext(
                stage=stage,
                model_path=values.pop("model_path"),
                device=torch_device(values.pop("gpu_id"), stage),
                settings=engine_settings(
                    values.pop("engine_settings"), values.pop("gpu_memory_fraction")
                ),
                dtype=values.pop("dtype"),
                load_format=values.pop("load_format"),
                seed=values.pop("seed"),
            )
            return build(engine, **values)

        factory.__signature__ = signature  # type: ignore[attr-defined]
        return factory

    return decorate


def tp_group(stage: str, tp_rank: int, tp_size: int) -> Any:
    """This process's tensor-parallel group (the runtime formed it), or None at tp_size 1."""
    if tp_size == 1:
        return None
    from ..engine.tp import current_group

    group = current_group()
    if group is None or (group.rank, group.size) != (tp_rank, tp_size):
        raise RuntimeError(
            f"stage {stage} has tp_size {tp_size}, but this process is not rank {tp_rank} of a "
            "tensor-parallel group; run it through omni's runtime, which forms the group"
        )
    return group


class WorkerThreadStage:
    """A stage whose work for a request runs in a worker thread, after a field check.

    Subclasses name their pipeline (for messages), the request fields they
    accept, and implement :meth:`prepare`.
    """

    pipeline: ClassVar[str]
    request_keys: ClassVar[Collection[str]]

    async def run(self, request: Any) -> dict[str, Any]:
        import anyio

        # Tokenizing and decoding a reference clip can take long enough to
        # silence this process's heartbeat if run on its event loop.
        return await anyio.to_thread.run_sync(self._prepare_checked, dict(request.data or {}))

    def _prepare_checked(self, data: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(data) - set(self.request_keys))
        if unknown:
            raise RequestError(
                f"unknown field {unknown[0]!r} for {self.pipeline}",
                hint="accepted: " + ", ".join(sorted(self.request_keys)),
            )
        self.check(data)
        return self.prepare(data)

    def check(self, data: dict[str, Any]) -> None:
        """Bounds every request meets before :meth:`prepare` (none here)."""

    def prepare(self, data: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement prepare()")


class TTSPreprocessing(WorkerThreadStage):
    """A TTS preprocessing stage's bounds: the ``factory.*`` of ``TTSPreprocessingArgs``.

    The class is its own stage factory (its parameters are those settings,
    ``model_path`` injected): a family implements :meth:`load`, reading its
    configs and tokenizer, and :meth:`prepare`. ``max_frames`` defaults to the
    release's cap; the text fields are counted in tokens against
    ``max_input_tokens`` before :meth:`prepare` sees the request.
    """

    text_fields: ClassVar[tuple[str, ...]] = ("input", "instructions", "ref_text")

    def __init__(
        self,
        model_path: str,
        max_ref_audio_seconds: float = 30.0,
        max_frames: int | None = None,
        max_input_tokens: int = 8192,
    ):
        self.encode, max_new_tokens = self.load(model_path)
        self.max_ref_audio_seconds = max_ref_audio_seconds
        self.max_frames = max_frames or max_new_tokens
        self.max_input_tokens = max_input_tokens

    def load(self, model_path: str) -> tuple[Callable[[str], list[int]], int]:
        """Read the family's configs and tokenizer: (the text encoder, the frame cap)."""
        raise NotImplementedError(f"{type(self).__name__} must implement load()")

    def check(self, data: dict[str, Any]) -> None:
        from ..engine.text_budget import check_text_tokens

        check_text_tokens(
            self.encode,
            data,
            self.text_fields,
            self.max_input_tokens,
            "factory.max_input_tokens of the preprocessing stage",
        )


def number(data: dict[str, Any], key: str, default: Any, kind: type) -> Any:
    """``data[key]`` as ``kind`` (int or float), ``default`` when absent or null."""
    value = data.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{key!r} must be a number, got {value!r}")
    if kind is int and value != int(value):
        raise RequestError(f"{key!r} must be an integer, got {value!r}")
    return kind(value)


def text(data: dict[str, Any], key: str) -> str | None:
    """``data[key]`` when it is a string, None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise RequestError(f"{key!r} must be a string, got {type(value).__name__}")
    return value
