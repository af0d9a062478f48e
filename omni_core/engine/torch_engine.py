"""The PyTorch engine backend: continuous batching over a slot KV cache.

One scheduler task owns every piece of state (waiting queue, running batch,
free slots) and runs on the event loop; only the model's compute leaves it,
one step at a time, for the process's compute thread (:mod:`.compute`), so the
event loop keeps serving while a step runs. Each
iteration, between steps:

1. drop aborted and finished sequences, freeing their slots;
2. when the step starts on the compute thread (so that requests arriving
   while it waits there join it), admit waiting requests in arrival order
   while a slot is free and the step's prompt positions stay within
   ``engine.max_prefill_tokens``; a
   prompt longer than the step has room for, or than
   ``engine.chunked_prefill_size``, is prefilled in chunks, one per step
   (first the chunk of the prompt in progress, then newcomers), where the
   model offers ``chunked_prefill``: the running sequences decode between
   its chunks instead of waiting for all of it;
3. in one compute-thread call, prefill the newcomers (copying the longest
   prompt prefix another slot holds first, :mod:`.prefix_cache`; a newcomer
   that shares a head with one admitted before it in this step is prefilled
   in a later wave of the same call, after that head is written, and copies
   it) and decode the running
   sequences the model calls ready (all, unless it implements ``ready(seq)``:
   a sequence fed by a stream waits for its next input, and the scheduler
   sleeps until :meth:`TorchEngine.wake` when none is ready); the newcomers
   join the decode batch from the next step on;
4. hand each result to its request's stream, and finish sequences that said
   so, reached ``max_new_tokens``, or filled their slot.

A request's outputs reach its consumer through an unbounded anyio memory
stream as soon as the step that made them returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..errors import OmniError, RequestError
from .buckets import StaticPlan, static_plan
from .budget import SlotPlan, plan_slots
from .compute import run_compute
from .interface import (
    EngineError,
    EngineSettings,
    SamplingParams,
    Sequence,
    SequenceError,
    StepModel,
    StepResult,
    check_sampling,
)
from .kv_cache import SlotKVCache
from .prefix_cache import PrefixIndex, block_keys, reusable, shared_blocks
from .sampling import make_generator

log = logging.getLogger(__name__)


class EngineClosed(EngineError):
    """The engine stopped before the request finished."""


@dataclass(frozen=True)
class _Failure:
    error: BaseException


@dataclass(eq=False)
class _Request:
    seq: Sequence
    seed: int
    length: int
    send: MemoryObjectSendStream[Any]
    stream: RequestStream
    aborted: bool = False
    #: chained block keys of the prompt (None: not computed yet, or not shareable)
    keys: list[bytes] | None = None
    #: the model's ``prefix_rows`` of the prompt (None: not shareable)
    rows: torch.Tensor | None = None
    #: the model may prefill this prompt in chunks (``chunked_prefill``)
    chunkable: bool = False
    #: prompt positions this step's prefill computes at most (0: the rest of the prompt)
    chunk: int = 0
    #: a chunk of the prompt was prefilled, not all of it: the next step goes on
    partial: bool = False
    #: ``seq.cached`` when this step's prefill began, and the positions copied into the slot
    start: int = 0
    copied: int = 0


@dataclass
class _StepOutcome:
    """What one worker-thread call produced: a result or an error per request."""

    results: list[tuple[_Request, StepResult]] = field(default_factory=list)
    errors: list[tuple[_Request, BaseException]] = field(default_factory=list)
    #: requests taken from the queue for this step (they hold slots now)
    admitted: list[_Request] = field(default_factory=list)
    #: whether the step prefilled or decoded anything
    computed: bool = False


class RequestStream:
    """The outputs of one request, in step order; ends when the request finishes.

    Iterate it with ``async for``. A failed request raises its error from the
    iteration. ``aclose()`` (or leaving ``async with``) before the end aborts
    the request, and so does cancelling the task that waits on it (a client
    that went away must not keep a slot). ``finish_reason`` is ``stop`` (the
    model said so), ``length`` (``max_new_tokens`` or a full slot), ``abort``,
    or ``error``.
    """

    def __init__(self, engine: TorchEngine, request_id: str, receive: MemoryObjectReceiveStream):
        self.request_id = request_id
        self.finish_reason: str | None = None
        self.steps = 0
        self._engine, self._receive = engine, receive

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None
        except anyio.get_cancelled_exc_class():
            self._engine.abort(self.request_id)  # its consumer is gone: free the slot
            raise
        if isinstance(item, _Failure):
            raise item.error
        return item

    async def aclose(self) -> None:
        if self.finish_reason is None:
            self._engine.abort(self.request_id)
        self._receive.close()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class TorchEngine:
    """Continuous batching of a :class:`StepModel` on CPU or CUDA.

    ``device_memory`` / ``used_memory`` (bytes) override what the device
    reports, for sizing the cache from ``engine.mem_fraction_static`` (see
    :mod:`omni_core.engine.budget`); on CUDA they are read from the device.
    ``static`` overrides the static decode plan the settings give (tests and
    benchmarks run the static-shape step without compiling it this way).
    """

    def __init__(
        self,
        model: StepModel,
        settings: EngineSettings,
        *,
        device: str | torch.device | None = None,
        device_memory: int | None = None,
        used_memory: int | None = None,
        static: StaticPlan | None = None,
    ):
        self.model, self.settings = model, settings
        layout = model.cache_layout()
        self.device = _resolve_device(settings.device, device, layout.device)
        if device_memory is None and self.device.type == "cuda":
            device_memory = torch.cuda.get_device_properties(self.device).total_memory
            if used_memory is None:
                used_memory = torch.cuda.memory_allocated(self.device)
        self.plan: SlotPlan = plan_slots(
            settings, layout, device_memory=device_memory, used_memory=used_memory or 0
        )
        self.static: StaticPlan = static or static_plan(settings, self.device.type)
        prepare = getattr(model, "prepare_static", None)
        if self.static.enabled and prepare is None:
            log.warning("engine: %s has no static decode step; it decodes eagerly", model)
        use_static = self.static.enabled and prepare is not None
        self.cache = SlotKVCache(layout, self.plan.num_slots, self.plan.slot_len, spare=use_static)
        self.warm_up_seconds: float | None = None
        self._static_context: Any = None  # compiled.StaticContext, where steps are static
        if use_static:
            self.warm_up_seconds, self._static_context = _prepare_static(
                model, self.static, self.cache
            )
        self._waiting: deque[_Request] = deque()
        # the queue is added to and withdrawn from on the event loop and taken from on the
        # compute thread, when a step starts (_admit)
        self._queue_lock = threading.Lock()
        self._admitting: list[_Request] = []  # taken by the step in flight
        self._running: list[_Request] = []
        self._requests: dict[str, _Request] = {}
        self._wake: anyio.Event | None = None
        self._stopped: anyio.Event | None = None
        self._task: Any = None
        self._started = self._closing = False
        self.steps = 0  # compute-thread calls made, for tests and figures
        self.prefixes: PrefixIndex | None = _prefix_index(model, settings)
        #: prompt positions computed by prefills, and copied from a cached prefix instead
        self.prompt_positions = {"computed": 0, "cached": 0}
        #: prefills that computed a chunk of a long prompt, not its last
        self.prefill_chunks = 0

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Start the scheduler (idempotent; ``submit`` starts it too)."""
        self._ensure_started()

    async def aclose(self) -> None:
        """Stop after the step in flight; every unfinished request fails with EngineClosed."""
        self._closing = True
        if self._started and self._stopped is not None:
            self._poke()
            with anyio.CancelScope(shield=True):
                await self._stopped.wait()
        self._fail_all(EngineClosed("the engine was closed before the request finished"))

    async def __aenter__(self) -> TorchEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- requests ------------------------------------------------------------
    def enqueue(
        self, request_id: str, prompt: Any, sampling: SamplingParams | None = None
    ) -> RequestStream:
        """Queue a request; its outputs stream from the returned iterator.

        Refused here (RequestError) when its prompt could never be admitted or
        its sampling parameters are invalid; EngineClosed after ``aclose()``.
        """
        if self._closing:
            raise EngineClosed("the engine is closed")
        if request_id in self._requests:
            raise RequestError(f"request {request_id!r} is already in the engine")
        sampling = sampling if sampling is not None else SamplingParams()
        check_sampling(sampling)
        length = self.model.prompt_length(prompt)
        seq = Sequence(request_id, prompt, sampling)
        chunkable = self._chunkable(seq)
        self._check_fits(request_id, length, chunkable)
        self._ensure_started()
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
        send, receive = anyio.create_memory_object_stream[Any](math.inf)
        stream = RequestStream(self, request_id, receive)
        request = _Request(seq, seed, length, send, stream, chunkable=chunkable)
        self._requests[request_id] = request
        with self._queue_lock:
            self._waiting.append(request)
        self._poke()
        return stream

    def abort(self, request_id: str) -> bool:
        """Stop a request between steps and free its slot; False when it is not here.

        Its stream ends at once (``finish_reason`` ``abort``); an output of a
        step already in flight is dropped.
        """
        request = self._requests.get(request_id)
        if request is None:
            return False
        request.aborted = True
        with self._queue_lock:
            if request in self._waiting:
                self._waiting.remove(request)
        self._finish(request, "abort")
        self._poke()
        return True

    def wake(self) -> None:
        """New input arrived for a sequence the model said was not ready: look again.

        A model whose sequences are fed while they run (a prompt that streams
        in from another stage) implements ``ready(seq)``; the engine decodes
        only the ready ones and sleeps when none is, until this is called.
        Call it from the event loop that runs the engine.
        """
        self._poke()

    @property
    def compiled_misses(self) -> int:
        """Served decode steps that missed every compiled graph and ran eagerly, since the
        process started (``StaticDecoder.misses``; the log names the first of each shape)."""
        context = self._static_context
        return sum(d.misses for d in context.decoders) if context is not None else 0

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def free_slots(self) -> int:
        return len(self.cache.free)

    def _chunkable(self, seq: Sequence) -> bool:
        """Whether ``seq``'s prompt may be prefilled over several steps."""
        offered = getattr(self.model, "chunked_prefill", None)
        if self.settings.prefill_chunk is None or offered is None:
            return False
        try:
            return bool(offered(seq))
        except Exception:  # a model bug costs this request its chunking, not the caller
            log.exception("engine: chunked_prefill failed for %r", seq.request_id)
            return False

    def _check_fits(self, request_id: str, length: int, chunkable: bool) -> None:
        limits = []
        if length > self.plan.slot_len:
            why = {
                "memory": "engine.mem_fraction_static's memory",
                "memory, capped at max_position_embeddings": "the model's max_position_embeddings",
            }.get(self.plan.source, f"engine.max_total_tokens {self.plan.total_tokens}")
            limits.append(
                f"a cache slot holds {self.plan.slot_len} "
                f"({why} / engine.max_running_requests {self.plan.num_slots})"
            )
        if length > self.settings.max_prefill_tokens and not chunkable:
            if self.settings.prefill_chunk is None:
                why = "engine.chunked_prefill_size is -1"
            elif getattr(self.model, "chunked_prefill", None) is None:
                why = "this model prefills a prompt in one step"
            else:
                why = "the model prefills this request's prompt in one step"
            limits.append(
                f"engine.max_prefill_tokens is {self.settings.max_prefill_tokens} ({why})"
            )
        if limits:
            raise RequestError(
                f"request {request_id!r}: its prompt takes {length} cache positions, but "
                + " and ".join(limits)
                + "; it can never be admitted",
                hint="shorten the prompt, or raise the engine limits named above",
            )

    # -- the scheduler -------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._started:
            return
        self._task = _spawn(self._run)  # the task first runs at the caller's next await
        self._started = True
        self._wake, self._stopped = anyio.Event(), anyio.Event()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._stopped is not None
        try:
            while not self._closing:
                self._reap()
                if not self._waiting and not self._running:
                    self._wake = anyio.Event()
                    await self._wake.wait()
                    continue
                batch = [r for r in self._running if not r.partial and self._ready(r)]
                if not batch and not self._admissible():
                    # Every running sequence waits for input (a streamed prompt):
                    # sleep until wake() says some arrived, or a request joins.
                    self._wake = anyio.Event()
                    await self._wake.wait()
                    continue
                outcome = await run_compute(self._compute, batch)
                self._running += outcome.admitted
                self._admitting = []
                self.steps += outcome.computed
                self._deliver(outcome)
        except BaseException as exc:  # a bug here must not leave consumers waiting forever
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                log.exception("the engine scheduler crashed")
            self._closing = True
            self._fail_all(EngineError(f"the engine scheduler stopped: {exc!r}"))
            raise
        finally:
            self._stopped.set()

    def _ready(self, request: _Request) -> bool:
        ready = getattr(self.model, "ready", None)
        return ready is None or bool(ready(request.seq))

    def _admissible(self) -> bool:
        """Whether a step started now would prefill something."""
        return any(r.partial for r in self._running) or bool(self._waiting and self.cache.free)

    def _admit(self) -> list[_Request]:
        """This step's prefills: the next chunk of the prompt in progress, then newcomers.

        Taken on the compute thread when the step starts, not when the
        scheduler submits it: the step may wait behind other work there (the
        prompts of requests that arrived together, built on the same thread),
        and the requests that arrive meanwhile join it. Taken at submission,
        the first of eight MOSS-TTS requests sent at once ran a step ahead of
        the other seven, and its codec chunks were decoded apart from theirs.

        One prompt at a time is chunked (as SGLang's single chunked request):
        a second long prompt waits at the head of the queue until the first
        is in, and nobody overtakes it. A newcomer is charged the positions
        it will compute, not those it will copy (a cached head, or one a
        request admitted before it in this step computes): a conversation's
        next turn, its history copied, does not take the step's whole budget.
        """
        budget, size = self.settings.max_prefill_tokens, self.settings.prefill_chunk
        admitted = [r for r in self._running if r.partial]
        chunking = False  # a prompt goes on being chunked after this step
        for request in admitted:
            assert size is not None  # a partial prefill means chunks are on
            left = request.length - request.seq.cached
            request.chunk = min(size, budget, left)
            budget -= request.chunk
            chunking = chunking or request.chunk < left
        while self.cache.free and budget > 0:
            with self._queue_lock:
                request = self._waiting[0] if self._waiting else None
            if request is None:
                break
            cost = request.length - self._copied(request, admitted)
            whole = cost <= budget and (not request.chunkable or size is None or cost <= size)
            if whole:
                request.chunk = 0
            elif request.chunkable and size is not None and not chunking:
                request.chunk, chunking = min(size, budget), True
            else:
                break  # first come, first served: nobody overtakes the head of the queue
            with self._queue_lock:
                if not self._waiting or self._waiting[0] is not request:
                    continue  # aborted while it was priced: look at the new head
                self._waiting.popleft()
                self._admitting.append(request)
            budget -= request.chunk or cost
            request.seq.slot = self.cache.allocate()
            admitted.append(request)
        return admitted

    def _copied(self, request: _Request, admitted: list[_Request]) -> int:
        """Prompt positions ``request`` will copy rather than compute: the longest head the
        cache holds, or that a whole prefill admitted before it in this step computes."""
        if self.prefixes is None:
            return 0
        keys = self._prompt_keys(request)
        blocks, _ = self.prefixes.longest(keys)
        for other in admitted:
            if not other.partial and not other.chunk and other.keys:
                blocks = max(blocks, shared_blocks(keys, other.keys))
        return blocks * self.prefixes.block

    def _prompt_keys(self, request: _Request) -> list[bytes]:
        """The request's reusable prefix blocks (computed once, on the compute thread: a
        prompt with media hashes its encoders' rows, which the event loop should not wait
        for)."""
        if request.keys is None:
            try:
                rows = self.model.prefix_rows(request.seq)  # type: ignore[attr-defined]
                keys = [] if rows is None else block_keys(rows)
            except Exception:  # a model bug costs this request its reuse, not the scheduler
                log.exception("engine: prefix_rows failed for %r", request.seq.request_id)
                rows, keys = None, []
            request.keys, request.rows = reusable(keys, request.length), rows
        return request.keys

    def _index_answer(self, request: _Request) -> None:
        """Index a finished request's slot over its answer too (the positions it fed back).

        Why: a conversation's next turn sends this prompt and this answer back
        as the head of its own prompt, and the slot holds both until it is
        handed out again. The model says what decided the answer's positions
        (``generated_rows(seq)``, rows as ``prefix_rows`` gives them); a model
        without it shares prompts only.
        """
        answer = getattr(self.model, "generated_rows", None)
        seq = request.seq
        if self.prefixes is None or answer is None or request.rows is None or seq.slot < 0:
            return
        try:
            more = answer(seq)
            if more is None or not len(more):
                return
            rows = torch.cat([request.rows, more.to(request.rows.dtype)])
            keys = block_keys(rows[: seq.cached])
        except Exception:  # a model bug costs the next turn its reuse, not the scheduler
            log.exception("engine: generated_rows failed for %r", seq.request_id)
            return
        if len(keys) > self.prefixes.held(seq.slot):
            self.prefixes.register(seq.slot, keys)

    def _computed_alongside(self, request: _Request, admitted: list[_Request]) -> bool:
        """Would ``request`` compute prefix blocks that a request admitted this step computes?

        Then it is prefilled in a later wave and copies them: eight requests
        sharing a template compute it once, not eight times.
        """
        if self.prefixes is None:
            return False
        keys = self._prompt_keys(request)
        cached, _ = self.prefixes.longest(keys)
        alongside = max(shared_blocks(keys, self._prompt_keys(other)) for other in admitted)
        return alongside > cached

    def _reap(self) -> None:
        keep = []
        for request in self._running:
            if request.stream.finish_reason is None and not request.aborted:
                keep.append(request)
            else:
                if request.stream.finish_reason in ("stop", "length"):
                    self._index_answer(request)
                self.cache.release(request.seq.slot)
                request.seq.slot = -1
        self._running = keep

    def _deliver(self, outcome: _StepOutcome) -> None:
        for request, error in outcome.errors:
            if not request.aborted:
                self._fail(request, error)
        for request, result in outcome.results:
            if request.aborted or request.stream.finish_reason is not None or request.partial:
                continue  # a chunk of a prompt in progress yields nothing
            seq = request.seq
            seq.steps += 1
            request.stream.steps = seq.steps
            try:
                request.send.send_nowait(result.output)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                request.aborted = True  # the consumer went away: stop computing for it
                self._finish(request, "abort")
                continue
            # The caps first: a model may also call its last allowed step finished,
            # but the request ended because of the cap ("length"), not by itself.
            # A finished step with no output (a speech model's end-of-speech code,
            # which makes no frame) is the model stopping, even on the last step.
            limit = seq.sampling.max_new_tokens
            stopped = result.finished and result.output is None
            capped = limit is not None and seq.steps >= limit
            if not stopped and (capped or seq.cached >= self.plan.slot_len):
                self._finish(request, "length")
            elif result.finished:
                self._finish(request, "stop")

    def _finish(self, request: _Request, reason: str) -> None:
        if request.stream.finish_reason is None:
            request.stream.finish_reason = reason
            request.seq.finished = True
        request.send.close()
        self._requests.pop(request.seq.request_id, None)

    def _fail(self, request: _Request, error: BaseException) -> None:
        if request.stream.finish_reason is None:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                request.send.send_nowait(_Failure(error))
        self._finish(request, "error")

    def _fail_all(self, error: BaseException) -> None:
        with self._queue_lock:
            waiting = list(self._waiting)
        for request in dict.fromkeys([*self._running, *self._admitting, *waiting]):
            self._fail(request, error)
            if request.seq.slot >= 0:
                self.cache.release(request.seq.slot)
                request.seq.slot = -1
        self._running, self._admitting, self._waiting = [], [], deque()

    # -- in the worker thread ------------------------------------------------
    def _compute(self, batch: list[_Request]) -> _StepOutcome:
        """Admit and prefill this step's newcomers (and the next chunk of a prompt in
        progress), and decode ``batch``: the only code off the event loop."""
        outcome = _StepOutcome()
        prefill = self._admit()
        outcome.admitted = [r for r in prefill if not r.partial]
        outcome.computed = bool(prefill or batch)
        with torch.inference_mode():
            if self.prefixes is not None:
                for request in prefill:
                    self._prompt_keys(request)
            pending = prefill
            while pending:
                wave, pending = self._wave(pending)
                self._prefill(wave, outcome)
                self._prefilled(wave, outcome)
            if batch:
                self._step(self.model.decode, batch, outcome, retry=False)
        return outcome

    def _wave(self, requests: list[_Request]) -> tuple[list[_Request], list[_Request]]:
        """The requests to prefill now, and those that copy a head this wave computes.

        Why waves in one step rather than a step's wait (SGLang's in-batch
        check): requests that arrive together then finish their prefill
        together and stay in step, so a downstream stage that batches their
        outputs (a codec decoding chunks of frames) gets them in one batch,
        not two a step apart. Every wave holds at least one request.
        """
        if self.prefixes is None:
            return requests, []
        wave: list[_Request] = []
        later: list[_Request] = []
        for request in requests:
            if wave and self._computed_alongside(request, wave):
                later.append(request)
            else:
                wave.append(request)
        return wave, later

    def _prefill(self, requests: list[_Request], outcome: _StepOutcome) -> None:
        """Prefill each request's next chunk: from its start (copying a cached head
        first), or, for a prompt in progress, from where its last chunk ended."""
        for request in requests:
            seq = request.seq
            if not request.partial:
                _reset(request, self.device)
                if self.prefixes is not None:
                    self._reuse_prefix(request)
                request.copied = seq.cached
            request.start = seq.cached
            end = seq.cached + request.chunk
            seq.prefill_end = end if request.chunk and end < request.length else None
        self._step(self.model.prefill, requests, outcome, retry=True)

    def _reuse_prefix(self, request: _Request) -> None:
        """Copy the longest cached prefix of the request's prompt into its slot."""
        assert self.prefixes is not None
        seq, keys = request.seq, request.keys or []
        blocks, source = self.prefixes.longest(keys, prefer=seq.slot)
        if source is not None and source != seq.slot:
            self.prefixes.forget(seq.slot)
            self.cache.copy_prefix(source, seq.slot, blocks * self.prefixes.block)
            copied = getattr(self.model, "prefix_copied", None)
            if copied is not None:  # state the model keeps per slot beside the cache
                copied(source, seq.slot, blocks * self.prefixes.block)
        # the slot holds the copied blocks; what lay past them is the prefill's to overwrite
        self.prefixes.register(seq.slot, keys[:blocks])
        seq.cached = blocks * self.prefixes.block

    def _prefilled(self, requests: list[_Request], outcome: _StepOutcome) -> None:
        """Count the prompt positions computed and copied; index the prompt blocks
        written (a chunked prompt's so far), and forget the slots of the ones that
        failed."""
        done = {id(request): result for request, result in outcome.results}
        for request in requests:
            seq = request.seq
            seq.prefill_end = None
            if id(request) not in done:
                request.partial = False
                if self.prefixes is not None:
                    self.prefixes.forget(seq.slot)
                continue
            # a model may end a request at its first chunk (a talker with nothing to say)
            request.partial = seq.cached < request.length and not done[id(request)].finished
            self.prefill_chunks += request.partial
            if self.prefixes is not None:
                keys = request.keys or []
                if request.partial:
                    keys = keys[: seq.cached // self.prefixes.block]
                self.prefixes.register(seq.slot, keys)
            self.prompt_positions["cached"] += request.copied
            self.prompt_positions["computed"] += seq.cached - request.start
            request.copied = 0

    def _step(
        self,
        step: Callable[[list[Sequence], Any], list[StepResult]],
        requests: list[_Request],
        outcome: _StepOutcome,
        *,
        retry: bool,
    ) -> None:
        try:
            results = step([r.seq for r in requests], self.cache)
            if len(results) != len(requests):
                raise EngineError(
                    f"the model's {step.__name__} returned {len(results)} results "
                    f"for {len(requests)} sequences"
                )
        except Exception as exc:
            self._failed(step.__name__, requests, exc, outcome, retry=retry)
            return
        for request, result in zip(requests, results, strict=True):
            if result.error is not None:
                outcome.errors.append((request, _wrap(result.error, request, step.__name__)))
            else:
                outcome.results.append((request, result))

    def _failed(
        self,
        where: str,
        requests: list[_Request],
        error: Exception,
        outcome: _StepOutcome,
        *,
        retry: bool,
    ) -> None:
        """Fail only whom the error can be pinned on; prefill retries to find out."""
        named = set(error.request_ids) if isinstance(error, SequenceError) else set()
        culprits = [r for r in requests if r.seq.request_id in named]
        if culprits:
            outcome.errors += [(r, _wrap(error, r, where)) for r in culprits]
            others = [r for r in requests if r.seq.request_id not in named]
            if retry and others:
                self._prefill(_from_scratch(others), outcome)
            return  # decode: the others are as they were, and step again next time
        if retry and len(requests) > 1:
            for request in _from_scratch(requests):  # one at a time, to find the culprit
                self._prefill([request], outcome)
            return
        outcome.errors += [(r, _wrap(error, r, where)) for r in requests]


def _prefix_index(model: Any, settings: EngineSettings) -> PrefixIndex | None:
    """An index of cached prompt prefixes where the model offers them and nothing forbids."""
    if settings.disable_radix_cache or not callable(getattr(model, "prefix_rows", None)):
        return None
    if getattr(model, "tp_size", 1) > 1:
        # the other ranks' caches hold their KV heads; a copy here would not reach them
        return None
    return PrefixIndex()


def _prepare_static(model: Any, plan: StaticPlan, cache: SlotKVCache) -> tuple[float, Any]:
    """Let the model build its static decoders, compile/capture every bucket, say how long;
    the seconds it took and the ``StaticContext`` holding the decoders.

    Runs while the stage starts, so the process reports ready only once every
    bucket is compiled; the time goes to the process log (a real model's
    compile can take minutes: raise ``runtime.startup_timeout`` to match).
    """
    from .compiled import StaticContext, dense_linears

    if plan.compile:
        # inductor packs dense weights itself where it prepacks; elsewhere the routed
        # products stay, called as they are (omni::blocked_linear, omni::packed_linear)
        dense_linears(model, keep_routed=not plan.prepack)
    from torch._dynamo.utils import counters

    context = StaticContext(plan, cache)
    model.prepare_static(context)
    names = ", ".join(d.name for d in context.decoders) or "nothing"
    # Said first, so that a stage log silent for minutes (a cold compile) says why.
    doing = "compiling" if plan.compile else "capturing" if plan.cuda_graphs else "preparing"
    print(f"engine: {plan.reason}: {doing} {names} before the stage says ready", flush=True)
    graphs = counters["stats"]["unique_graphs"]
    seconds = context.warm_up()
    # How many graphs inductor built tells a slow start's cause: a model whose step
    # reads its batch builds bucket 1 apart (compiled.mark_rows_unbacked), and one whose
    # step guards on it, one a bucket (compiled.mark_rows_dynamic).
    built = counters["stats"]["unique_graphs"] - graphs
    count = f" ({built} compiled graph{'s' * (built != 1)})" if plan.compile else ""
    print(f"engine: {plan.reason}: {names} ready in {seconds:.1f} s{count}", flush=True)
    notes = [d.note for d in context.decoders if d.note] + context.notes
    for note in notes:
        print(f"engine: {note}", flush=True)
    return seconds, context


def _from_scratch(requests: list[_Request]) -> list[_Request]:
    """Requests whose failed prefill is retried from the start, a chunked prompt's too
    (the model's state for it is unknown; the blocks it had indexed are copied back)."""
    for request in requests:
        request.partial = False
    return requests


def _reset(request: _Request, device: torch.device) -> None:
    """A fresh sequence state for a (re)started prefill, with a generator at its seed."""
    seq = request.seq
    seq.cached = seq.steps = 0
    seq.state = {}
    seq.generator = make_generator(request.seed, device)


def _wrap(error: BaseException, request: _Request, where: str) -> BaseException:
    """The error a consumer sees: the model's own OmniError, or an EngineError naming it."""
    if isinstance(error, OmniError):
        return error
    wrapped = EngineError(
        f"request {request.seq.request_id!r}: the model's {where} step failed: "
        f"{type(error).__name__}: {error}"
    )
    wrapped.__cause__ = error
    return wrapped


def _resolve_device(
    configured: str | None, placed: str | torch.device | None, model: Any
) -> torch.device:
    """The device: engine.device, else placement's, else the model's; they must agree."""
    model_device = torch.device(model)
    for source, value in (("engine.device", configured), ("placement", placed)):
        if value is None:
            continue
        wanted = torch.device(value)
        if wanted.type != model_device.type or (
            wanted.index is not None
            and model_device.index is not None
            and wanted.index != model_device.index
        ):
            raise EngineError(
                f"{source} says {wanted}, but the model's cache layout is on {model_device}",
                hint="load the model on the engine's device",
            )
    return model_device


def _spawn(run: Callable[[], Any]) -> Any:
    """Run the scheduler as a task of its own, not tied to the caller's task.

    A stage's ``start()`` and its requests run in different tasks, none of
    which lives as long as the engine, so there is no task group to start the
    scheduler in; the event loop itself keeps it (asyncio) or a system task does (trio).
    """
    try:
        return asyncio.get_running_loop().create_task(run())
    except RuntimeError:
        pass
    try:
        import trio  # anyio's other backend

        trio.lowlevel.spawn_system_task(run)
    except (ImportError, RuntimeError):
        raise EngineError("the engine needs a running event loop (asyncio or trio)") from None
    return None
