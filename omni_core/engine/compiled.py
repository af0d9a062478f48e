"""Compiled (and, on CUDA, captured) decode steps with static shapes per batch bucket.

A model that can decode with static shapes implements
``prepare_static(context)``: it asks the :class:`StaticContext` the engine
hands it for one :class:`StaticDecoder` per decoder it runs (a talker and its
code predictor; a backbone; a thinker), and from then on calls each in its
decode step. A :class:`StaticDecoder` takes the step's new rows, their rotary
positions, their cache positions and their slots, pads the batch up to its
bucket (:mod:`.buckets`), runs the compiled or captured step over the
shortest slot span that holds its rows (:func:`attention_spans`; a dynamic
size of the compiled graph, so one graph serves them, as the batch is one for
every bucket: :func:`mark_rows_unbacked`; :mod:`.static_kv` gives the
static-shape cache; :mod:`.cuda_graphs` the capture) and returns
the real rows; for a batch above the largest bucket it
returns None and the model runs its eager step. All buckets and spans are
compiled at start-up (:meth:`StaticContext.warm_up`), before the process
says ready; each decoder layer is traced and built once per shape and run
as every layer of its kind (:mod:`.layer_regions`), which is most of what
that start-up costs.

The sampling around a step stays eager where it is per-request Python
(seeded generators, repetition penalties). A model may capture more around
its steps once they are captured (:meth:`StaticContext.after_warm_up`): the
Qwen3-TTS / Qwen3-Omni code predictor captures a whole frame, its picks
included, with each row's random numbers drawn before the frame, and
compiled without CUDA graphs compiles that frame as one graph, stepping with
:meth:`StaticDecoder.body` (:mod:`.warm_compiled`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .buckets import StaticPlan, bucket_for
from .compute import call_on_compute_thread
from .cuda_graphs import CapturedStep, graph_pool
from .inductor_options import step_options
from .layer_regions import regions_wanted
from .static_kv import StaticSlotStore, key_mask, static_mask

log = logging.getLogger(__name__)

#: Dynamo keeps this many compiled graphs per code object; each bucket, each
#: step length and each decoder sharing a layer class adds one.
RECOMPILE_LIMIT = 256

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], Any]

#: The shortest slot span a static step attends over, and how many spans at most: where
#: each span costs a compile (weights prepacked into the graph, seconds) or nothing (the
#: uncompiled static step), and where each costs a CUDA graph capture (tens of
#: milliseconds) or nothing but a guard (compiled with the span a dynamic size).
SMALLEST_SPAN = 128
MOST_SPANS = 4
MOST_CAPTURED_SPANS = 9


def attention_spans(capacity: int, many: bool) -> tuple[int, ...]:
    """The slot lengths a decoder's static steps read, shortest first; each is a shape.

    Why: a static step reads every row's slot up to a fixed length, and at
    the slot's whole capacity that read outweighs the weights. A Qwen3-TTS
    0.6B talker step keeps 115 KB of keys and values per position, so with
    ``bench_qwen3_tts.py``'s 512 positions per slot it copied and read 176 MB
    per row for rows about 100 positions long, against 880 MB of bf16 weights
    for the whole batch; on a GPU, whose cache is sized from memory (tens of
    thousands of positions a slot), a step over the whole capacity read 3.7 GB
    a row for that talker. A step therefore reads the shortest span that
    holds its longest row: the capacity, halved while not below
    ``SMALLEST_SPAN``, ``MOST_SPANS`` at most, or ``MOST_CAPTURED_SPANS``
    where spans are cheap (``many``): a compiled step whose span is a dynamic
    size (one inductor graph for all spans) and CUDA graphs (each
    span one more capture, tens of milliseconds). Steps compiled with the span
    static (weights prepacked into each graph) keep ``MOST_SPANS``: each span
    is another compile, seconds.
    """
    most = MOST_CAPTURED_SPANS if many else MOST_SPANS
    spans = [capacity]
    while len(spans) < most and spans[-1] // 2 >= SMALLEST_SPAN:
        spans.append(spans[-1] // 2)
    return tuple(reversed(spans))


def mark_rows_dynamic(
    x: torch.Tensor, positions: torch.Tensor, cache_pos: torch.Tensor, slots: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Views of a compiled step's inputs with the batch (their rows) marked a dynamic size,
    so that buckets share a graph; the fallback of :func:`mark_rows_unbacked`.

    Why: with every size static, each bucket was a compile of its own, and
    the buckets 1-8 of Qwen3-TTS 0.6B (a talker, a code predictor with two
    step lengths) built 12 graphs. With the rows dynamic, buckets from 2 up
    share one graph per step length (dynamo specialises a size of 1, so
    bucket 1 keeps its own). Measured on this 2-core machine, bf16, buckets
    1-8, cold inductor cache: Qwen3-TTS 0.6B ready in 34.4 s against 50.1,
    the thinker's 2-layer benchmark 15.2 against 20.1 s, MOSS-TTS's 13.2
    against 18.2; throughput unchanged within the noise. Marked "maybe", as
    the span: a step that guards on its batch after all (torch's functorch
    decomposition of a linear layer with a bias reads a 3-D input's sizes as
    numbers inside a reused layer region: ``toy_model._rows`` avoids it)
    compiles a graph a bucket, as before, rather than refuse. ``positions``
    holds its rows in its next-to-last dimension (``[B, T]`` or M-RoPE's
    ``[3, B, T]``). Views, not the tensors given: dynamo reads marks off a
    tensor object, and those of a failed unbacked attempt must not stay.
    """
    views = _fresh_views(x, positions, cache_pos, slots)
    for tensor, dim in zip(views, _row_dims(positions), strict=True):
        torch._dynamo.maybe_mark_dynamic(tensor, dim)
    return views


def mark_rows_unbacked(
    x: torch.Tensor,
    positions: torch.Tensor,
    cache_pos: torch.Tensor,
    slots: torch.Tensor,
    most: int,
) -> tuple[torch.Tensor, ...]:
    """Views of a compiled step's inputs whose batch is one unbacked size of 1 to ``most``:
    every bucket, 1 included, shares one graph per step length.

    Why: a backed dynamic size is specialised at 1 (:func:`mark_rows_dynamic`),
    so bucket 1 compiled a graph of its own, per step length. An unbacked size
    is never specialised; the four inputs share it (``shape_id``), as they
    share their rows, and the graph checks 1 <= rows <= ``most`` when it runs.
    The price: a step may not branch on its batch (dynamo cannot guard on an
    unbacked size), so the first compile runs with graph breaks as errors
    and, should one occur, the step falls back to :func:`mark_rows_dynamic`.
    Measured on this 2-core machine, bf16, buckets 1-8, alternated with bucket
    1 apart: Qwen3-TTS 0.6B built 3 graphs instead of 6, ready in 4.2-4.3 s
    against 5.8-5.9 with a warm inductor cache (34.5 against 37.8 cold), its
    concurrency-1 frame and concurrency-8 throughput unchanged within the
    noise; the thinker's 6-layer start (``bench_compile_start.py``) 13.3
    against 15.4 s cold, 2.3 against 2.8 warm.
    """
    views = _fresh_views(x, positions, cache_pos, slots)
    for tensor, dim in zip(views, _row_dims(positions), strict=True):
        torch._dynamo.decorators.mark_unbacked(tensor, dim, shape_id=ROWS, min=1, max=most)
    return views


#: The name the four inputs of a compiled step share their unbacked batch size by.
ROWS = "omni_rows"


def _fresh_views(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same tensors as new objects (views, no copy: a captured graph still reads the
    caller's memory), free of any marks dynamo left on the originals. The step's inputs
    never share memory (:meth:`StaticDecoder._padded`), so neither do the views."""
    return tuple(tensor.view(tensor.shape) for tensor in tensors)


def runs_compiled(call: Callable[[], Any]) -> bool:
    """Whether ``call()`` ran a compiled graph or replayed a CUDA graph, as torch's profiler
    saw it (a compiled region; ``cudaGraphLaunch``, where CUDA is there to record).

    Why: after warm-up a step whose inputs miss every graph's guards runs
    eagerly, right but slow (the engine warns once per shape and counts them
    in ``StaticDecoder.misses``), so a test (and a plugin author checking a
    model) asks the profiler whether serving steps hit the graphs warm-up built.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        call()
    return any(
        "Compiled" in event.name or event.name == "cudaGraphLaunch" for event in prof.events()
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def _row_dims(positions: torch.Tensor) -> tuple[int, int, int, int]:
    """Where the rows are in ``x``, ``positions``, ``cache_pos`` and ``slots``."""
    return 0, positions.dim() - 2, 0, 0


def _pad(tensor: torch.Tensor, rows: int, dim: int, fill: float | int) -> torch.Tensor:
    """``tensor`` with its ``dim`` extended to ``rows`` entries of ``fill``."""
    missing = rows - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor, tensor.new_full(shape, fill)], dim=dim)


def _apart(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``inputs`` with any that shares memory with an earlier one copied.

    Why: a compiled graph guards on which of its inputs alias each other. Models
    pass one tensor as both rotary and cache positions (a single rotary stream)
    unless it was padded up to the bucket, when each is padded into a tensor of
    its own; so a graph traced over one pattern missed the other's steps, which
    then ran eagerly, silently (found with the batch unbacked: every batch that
    was not a bucket's size). Copying the few integers of an aliased input makes
    every step, warm-up's too, look alike.
    """
    seen: set[int] = set()
    out = []
    for tensor in inputs:
        where = tensor.untyped_storage().data_ptr()
        out.append(tensor.clone() if where in seen else tensor)
        seen.add(where)
    return tuple(out)


def _rows(output: Any, batch: int) -> Any:
    """The first ``batch`` rows of a step's output (a tensor, a tuple or dict of them), copied.

    Copied because a captured graph's output buffer is overwritten by the next replay.
    """
    if isinstance(output, torch.Tensor):
        return output[:batch].clone()
    if isinstance(output, dict):
        return {key: _rows(item, batch) for key, item in output.items()}
    return type(output)(_rows(item, batch) for item in output)


class StaticDecoder:
    """One decoder's step over a fixed-capacity cache, one static shape per bucket.

    ``forward(x, positions, mask, store)`` is the decoder (``x`` ``[B, T, H]``,
    ``positions`` its rotary positions, ``[B, T]`` or ``[3, B, T]``); ``k_cache``
    / ``v_cache`` ``[layers, slots, heads, capacity, dim]`` the cache it
    writes, whose slot ``pad_slot`` no sequence owns (padding rows write
    there). ``steps``: the new-token counts per row it is warmed up for (1
    for a decoder; a code predictor also starts a frame with 2).
    ``graph_safe``: whether the step can be captured as a CUDA graph (a
    mixture of experts that reads its routing on the host cannot).
    """

    def __init__(
        self,
        name: str,
        forward: Forward,
        plan: StaticPlan,
        *,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        pad_slot: int,
        hidden: int,
        dtype: torch.dtype,
        rope_streams: int = 1,
        steps: Sequence[int] = (1,),
        graph_safe: bool = True,
    ):
        self.name, self.forward, self.plan = name, forward, plan
        self.k_cache, self.v_cache, self.pad_slot = k_cache, v_cache, pad_slot
        self.hidden, self.dtype, self.rope_streams = hidden, dtype, rope_streams
        self.steps = tuple(steps)
        self.device = k_cache.device
        self.use_graphs = plan.cuda_graphs and graph_safe and self.device.type == "cuda"
        self.note = ""
        if plan.cuda_graphs and not graph_safe:
            self.note = f"{name}: not captured as CUDA graphs (its step reads data on the host)"
        # CUDA graphs were the only reason for static shapes and this step cannot be
        # captured: its eager step (which reads only the filled part of each slot) is better.
        self.enabled = not (plan.cuda_graphs and not self.use_graphs and not plan.compile)
        self._step: Callable[..., Any] = self._eager_step
        self._keys: dict[int, torch.Tensor] = {}
        #: one compiled graph for every span (the span a dynamic size, as the batch)
        self.dynamic_span = False
        self.prepacked = False
        #: compiled: the batch an unbacked size (mark_rows_unbacked) until a trace refuses it
        self.rows_unbacked = True
        self.unbacked_refusal = ""
        #: compiled: each layer built once and run as every layer (layer_regions); not where
        #: the weights are frozen into the graph (prepacked), which differ in every layer
        self.regions = plan.compile and regions_wanted()
        self.spans = attention_spans(k_cache.shape[3], many=self.use_graphs)
        if plan.compile:
            self._step = self._compiled_step(plan)
            self.spans = attention_spans(
                k_cache.shape[3], many=self.dynamic_span or self.use_graphs
            )
        self._graphs: dict[tuple[int, int, int], CapturedStep] = {}  # bucket, steps, span
        self.calls = 0  # steps run statically (tests and figures)
        self.misses = 0  # served steps that missed every compiled graph: run eagerly
        self._warned: set[tuple[int, int]] = set()
        self.warm = False  # every bucket compiled: from now on a recompile runs eagerly

    def _compiled_step(self, plan: StaticPlan) -> Callable[..., Any]:
        """The step through inductor; prepacked (:mod:`.prepack`) where asked and it pays."""
        if plan.prepack and not self.use_graphs:
            from . import prepack

            why = prepack.refusal(self.forward, self.dtype, self.device)
            if why is None:
                module = prepack.step_module(self.forward)
                assert module is not None  # refusal() checked it
                prepack.route_to_template(module)
                self.prepacked = True
                self.regions = False
                graphs = len(self.buckets) * len(self.steps) * len(self.spans)
                size = prepack.product_bytes(module)
                self.note = (
                    f"{self.name}: weights ({size / 1e6:.0f} MB) packed for inductor's CPU "
                    f"GEMM template into each of its {graphs} compiled graphs "
                    f"(up to {graphs * size / 1e9:.2f} GB)"
                )
                return prepack.compile_prepacked(self._eager_step)
            self.note = f"{self.name}: weights not prepacked ({why})"
        compiled = torch.compile(self._span_step, dynamic=False, options=step_options())

        def step(
            x: torch.Tensor,
            positions: torch.Tensor,
            cache_pos: torch.Tensor,
            slots: torch.Tensor,
            span: int | None = None,
        ) -> Any:
            keys = self._key_positions(self.spans[-1] if span is None else span)
            if self.warm:  # a guard checks sizes whatever the marks: only tracing reads them
                return compiled(x, positions, cache_pos, slots, keys)
            if self.rows_unbacked:
                rows = mark_rows_unbacked(x, positions, cache_pos, slots, max(self.buckets))
                try:
                    with torch._dynamo.error_on_graph_break(True):
                        return compiled(*rows, keys)
                except Exception as exc:  # the step reads its batch: bucket 1 apart
                    self.rows_unbacked = False
                    self.unbacked_refusal = f"{type(exc).__name__}: {_first_line(exc)}"
                    self._say(
                        f"{self.name}: bucket 1 compiled apart from the others, as the step "
                        f"reads its batch size ({self.unbacked_refusal})"
                    )
            return compiled(*mark_rows_dynamic(x, positions, cache_pos, slots), keys)

        self.dynamic_span = True
        return step

    def _say(self, note: str) -> None:
        """A note the engine prints once its steps are ready (after any earlier one)."""
        self.note = f"{self.note}; {note}" if self.note else note
        log.info("engine: %s", note)

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.plan.buckets

    def owns(self, k_cache: torch.Tensor) -> bool:
        """Whether ``k_cache`` is the cache this decoder was prepared for."""
        return k_cache is self.k_cache

    def fits(self, x: torch.Tensor) -> bool:
        """Whether rows ``x`` ``[B, ...]`` can take the static step (a bucket holds B)."""
        return (
            self.enabled
            and x.device == self.device
            and bucket_for(x.shape[0], self.buckets) is not None
        )

    def _eager_step(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache_pos: torch.Tensor,
        slots: torch.Tensor,
        span: int | None = None,
    ) -> Any:
        span = self.spans[-1] if span is None else span
        store = StaticSlotStore(
            self.k_cache, self.v_cache, slots, cache_pos, span, regions=self.regions
        )
        return self.forward(x, positions, static_mask(cache_pos, span), store)

    def _span_step(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache_pos: torch.Tensor,
        slots: torch.Tensor,
        keys: torch.Tensor,
    ) -> Any:
        """The step over the first ``len(keys)`` positions of each slot (``keys`` their
        numbers): the span a tensor's size, which the compiled step takes as dynamic, so
        that one graph a bucket serves every span (:func:`attention_spans`)."""
        span = keys.shape[0]
        store = StaticSlotStore(
            self.k_cache, self.v_cache, slots, cache_pos, span, regions=self.regions
        )
        return self.forward(x, positions, key_mask(cache_pos, keys), store)

    def body(self, span: int | None = None) -> Callable[..., Any]:
        """The step as plain code over ``span`` (default: the whole capacity), taking
        ``(x, positions, cache_pos, slots)`` of a full bucket.

        For a caller that compiles a larger function around several steps (a
        code predictor's whole frame): dynamo then traces them into its one
        graph, where calling the compiled step would enter a graph of its own
        each time. It reads the cache as the compiled step does (the span's
        key positions a tensor), so its graphs equal the step's.
        """
        span = self.spans[-1] if span is None else span
        if self.dynamic_span:
            return functools.partial(self._span_step, keys=self._key_positions(span))
        return functools.partial(self._eager_step, span=span)

    def _key_positions(self, span: int) -> torch.Tensor:
        """``arange(span)`` on the device, one tensor per span (a captured graph reads it at
        a fixed address), its size marked dynamic for dynamo.

        Marked "maybe": should a model's step guard on the span's value after all
        (a branch on it), the spans that fail the guard compile a graph of their own
        where a strict mark would refuse to compile at all. The stores read the
        cache so that none does (``static_kv.read_span``).
        """
        keys = self._keys.get(span)
        if keys is None:
            keys = torch.arange(span, device=self.device)
            torch._dynamo.maybe_mark_dynamic(keys, 0)
            self._keys[span] = keys
        return keys

    def span_for(self, cache_pos: torch.Tensor, longest: int | None = None) -> int:
        """The shortest of :attr:`spans` that holds every row's new positions.

        ``longest``: one past the last cache position any row writes, as the
        caller knows it on the host. Without it the positions are read, which
        on a GPU waits for the device; a captured step then takes the whole
        capacity instead.
        """
        if len(self.spans) == 1:
            return self.spans[0]
        if longest is None:
            if self.use_graphs or cache_pos.device.type != "cpu":
                return self.spans[-1]
            longest = int(cache_pos.max()) + 1  # on the CPU: no device to wait for
        return next((s for s in self.spans if s >= longest), self.spans[-1])

    def __call__(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache_pos: torch.Tensor,
        slots: torch.Tensor,
        longest: int | None = None,
    ) -> Any:
        """The step's output for the ``B`` real rows, or None when ``B`` is above every bucket.

        ``longest`` (one past the last cache position written, known on the
        host) picks the span without reading ``cache_pos``.
        """
        batch, steps = x.shape[0], x.shape[1]
        bucket = bucket_for(batch, self.buckets)
        if bucket is None:
            return None
        inputs = self._padded(bucket, x, positions, cache_pos, slots)
        span = self.span_for(cache_pos, longest)
        graph = self._graphs.get((bucket, steps, span))
        self.calls += 1
        if graph is not None:
            return _rows(graph(*inputs), batch)
        if not self.warm:
            return _rows(self._step(*inputs, span), batch)
        # Every shape was compiled at start-up: a guard that still fails (an input
        # nobody foresaw) runs this step eagerly rather than stall every running
        # request for a compile (seconds; a prepacked one also adds a weight copy),
        # and says so once, since eager is right but slow and would pass unnoticed.
        # Under a Python dispatch mode (a benchmark counting the bytes a step reads)
        # the tensors carry keys no graph was traced with: eagerly, and quietly.
        if is_in_torch_dispatch_mode():
            with torch.compiler.set_stance("force_eager"):
                return _rows(self._step(*inputs, span), batch)
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return _rows(self._step(*inputs, span), batch)
        except RuntimeError as exc:
            if "fail_on_recompile" not in str(exc):
                raise
            self._missed(batch, bucket, steps, exc)
        with torch.compiler.set_stance("force_eager"):
            return _rows(self._step(*inputs, span), batch)

    def _missed(self, batch: int, bucket: int, steps: int, exc: RuntimeError) -> None:
        """Count a served step that missed every compiled graph; warn once per shape."""
        self.misses += 1
        if (bucket, steps) in self._warned:
            return
        self._warned.add((bucket, steps))
        failures = [line.strip() for line in str(exc).splitlines() if line.strip()[:2] == "- "]
        log.warning(
            "engine: %s: a step of %d row(s) (bucket %d, %d position(s) a row) missed every "
            "compiled graph and ran eagerly (said once a shape): %s",
            self.name,
            batch,
            bucket,
            steps,
            "; ".join(failures[:2]) or _first_line(exc),
        )

    def _padded(
        self,
        bucket: int,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache_pos: torch.Tensor,
        slots: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        row_dim = 1 if positions.dim() == 3 else 0
        # Contiguous, as the warm-up's examples: a compiled graph guards on strides,
        # and a caller's expanded view (stride 0) of a full bucket would otherwise
        # miss every graph and compile a new one in the middle of serving.
        padded = (
            _pad(x, bucket, 0, 0).contiguous(),
            _pad(positions, bucket, row_dim, 0).contiguous(),
            _pad(cache_pos, bucket, 0, 0).contiguous(),
            _pad(slots, bucket, 0, self.pad_slot).contiguous(),
        )
        return _apart(*padded)

    def example(self, bucket: int, steps: int) -> tuple[torch.Tensor, ...]:
        """Inputs of a bucket made of padding rows only (for warm-up and capture)."""
        device = self.device
        x = torch.zeros(bucket, steps, self.hidden, dtype=self.dtype, device=device)
        where = torch.arange(steps, device=device)[None].expand(bucket, steps).contiguous()
        positions = where if self.rope_streams == 1 else where[None].expand(3, -1, -1).contiguous()
        slots = torch.full((bucket,), self.pad_slot, dtype=torch.long, device=device)
        return _apart(x, positions, where, slots)

    def warm_up(self) -> None:
        """Compile (and capture) every bucket, step length and span, largest bucket first."""
        if not self.enabled:
            return
        # One eager step first: whatever the model fills lazily on its first call
        # (a table cached per device) is then there when dynamo traces, instead of
        # a guard on its absence that fails on the first real step and recompiles.
        self._eager_step(*self.example(min(self.buckets), self.steps[0]))
        if self.use_graphs:
            try:
                self._capture_all()
                return
            except RuntimeError as exc:  # never run on this GPU before: fail soft, say so
                self._graphs.clear()
                self.use_graphs = False
                self.enabled = plan_allows_uncaptured(self.plan)
                self.spans = attention_spans(self.k_cache.shape[3], many=self.dynamic_span)
                self.note = (
                    f"{self.name}: CUDA graph capture failed ({type(exc).__name__}: {exc}); "
                    "it decodes without CUDA graphs (engine.disable_cuda_graph = true "
                    "turns them off for every stage)"
                )
                log.warning("engine: %s", self.note)
                if not self.enabled:
                    return
        # Compiled (or, a failed capture's fallback, compiled now): every shape before
        # serving, so that no request waits for a compile.
        try:
            self._compile_all()
        except Exception as exc:
            if not self.regions:
                raise
            # A layer dynamo cannot take whole as a region (a graph break in it) still
            # compiles as before, in pieces: slower to start, never refused.
            self.regions = False
            self.note = (
                f"{self.name}: each layer compiled on its own, not once for all "
                f"({type(exc).__name__}: {_first_line(exc)})"
            )
            log.warning("engine: %s", self.note)
            self._compile_all()
        self.warm = self.plan.compile

    def _compile_all(self) -> None:
        for bucket in sorted(self.buckets, reverse=True):
            for steps in self.steps:
                example = self.example(bucket, steps)
                for span in self.spans:
                    self._step(*example, span)

    def _capture_all(self) -> None:
        """One CUDA graph per bucket, step length and span, in one pool, largest first."""
        pool = graph_pool(self.device)
        for bucket in sorted(self.buckets, reverse=True):
            for steps in self.steps:
                example = self.example(bucket, steps)
                for span in reversed(self.spans):
                    step = functools.partial(self._step, span=span)
                    self._graphs[(bucket, steps, span)] = CapturedStep(step, example, pool=pool)


def dense_linears(model: Any, *, keep_routed: bool = False) -> int:
    """Turn oneDNN-packed linear layers under ``model`` back into ``nn.Linear``; how many.

    Inductor cannot trace a oneDNN tensor. Looks through the model object's
    module attributes (a step model holds its network as one); the dense
    weight is the packed one's values, so outputs do not change beyond float
    rounding. ``keep_routed``: the routed layers stay as they are, a compiled
    step calling their products through operators of ours: bf16 blocked ones
    through ``omni::blocked_linear`` (faster than inductor's own bf16
    products, see :mod:`~omni_core.engine.cpu_blocked_weight`), float32 ones
    through ``omni::packed_linear`` (MKL for a few rows, oneDNN beyond, as
    eagerly; inductor would give every batch to MKL, half oneDNN's speed at
    eight rows). Off where inductor is to pack the dense weights itself
    (``engine.cpu_weight_prepack``): then every one turns dense.
    """
    from torch import nn

    from .cpu_linear import BlockedLinear, BlockedRows, PackedLinear, RowLinear
    from .fused_linear import fuse_sibling_projections

    roots = [model] if isinstance(model, nn.Module) else []
    roots += [v for v in vars(model).values() if isinstance(v, nn.Module)]
    count = 0
    for root in roots:
        rows = 0
        for parent in list(root.modules()):
            for name, child in list(parent.named_children()):
                if not keep_routed and isinstance(
                    child, (PackedLinear, BlockedLinear, BlockedRows)
                ):
                    # a bf16 layer goes back to the routes it had (omni::row_product)
                    kind = nn.Linear if isinstance(child, PackedLinear) else RowLinear
                    linear = kind(child.in_features, child.out_features, bias=False, device="meta")
                    dense = child.packed.to_dense() if hasattr(child, "packed") else child.weight
                    linear.weight = nn.Parameter(dense, requires_grad=False)
                    linear.bias = child.bias
                    setattr(parent, name, linear)
                    count += 1
                    rows += isinstance(child, BlockedRows)
        if rows:  # a blocked group's layers: one dense product again, as packing fuses them
            fuse_sibling_projections(root, kinds=(RowLinear,))
    return count


def plan_allows_uncaptured(plan: StaticPlan) -> bool:
    """Whether a decoder whose capture failed still runs statically (compiled), or eagerly."""
    return plan.compile


class StaticContext:
    """What the engine gives a model's ``prepare_static``: the plan, the cache, the decoders.

    ``cache`` is the engine's :class:`~.kv_cache.SlotKVCache`, allocated with
    one spare slot for padding rows. ``decoder`` builds a decoder over it;
    ``scratch_decoder`` one over a cache of the model's own (a code
    predictor's per-frame positions). ``after_warm_up`` takes what a model
    captures around its decoders' steps once they are captured (a code
    predictor's whole frame, sampling included).
    """

    def __init__(self, plan: StaticPlan, cache: Any):
        self.plan, self.cache = plan, cache
        self.decoders: list[StaticDecoder] = []
        self._after: list[Callable[[], str | None]] = []
        #: What the after-warm-up callbacks said (the start-up log prints them).
        self.notes: list[str] = []

    def after_warm_up(self, callback: Callable[[], str | None]) -> None:
        """Run ``callback`` on the compute thread once every decoder is compiled and
        captured, before the process says ready; what it returns goes to the log."""
        self._after.append(callback)

    def decoder(self, name: str, forward: Forward, **kwargs: Any) -> StaticDecoder:
        """A static decoder over the engine's slot cache."""
        if self.cache.spare_slot is None:
            raise ValueError("the engine's cache has no spare slot for padding rows")
        built = StaticDecoder(
            name,
            forward,
            self.plan,
            k_cache=self.cache.k,
            v_cache=self.cache.v,
            pad_slot=self.cache.spare_slot,
            **kwargs,
        )
        self.decoders.append(built)
        return built

    def scratch_decoder(
        self,
        name: str,
        forward: Forward,
        *,
        layers: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        **kwargs: Any,
    ) -> StaticDecoder:
        """A static decoder over a cache of its own: one row per bucket row, plus a spare."""
        rows = max(self.plan.buckets) + 1
        shape = (layers, rows, kv_heads, capacity, head_dim)
        k = torch.zeros(shape, dtype=dtype, device=device)
        v = torch.zeros(shape, dtype=dtype, device=device)
        built = StaticDecoder(
            name, forward, self.plan, k_cache=k, v_cache=v, pad_slot=rows - 1, dtype=dtype, **kwargs
        )
        self.decoders.append(built)
        return built

    def warm_up(self) -> float:
        """Compile and capture every decoder's buckets; the seconds it took.

        On the compute thread, which runs the steps: dynamo guards on the
        calling thread's torch thread count, and a graph compiled at another
        count is compiled again at the first step of each bucket (until the
        recompile limit, and then the step runs eagerly).
        """
        started = time.perf_counter()
        call_on_compute_thread(self._warm_up_all)
        return time.perf_counter() - started

    def _warm_up_all(self) -> None:
        # Dynamo's configuration is per thread: raise the limits where the steps run.
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
        config.accumulated_recompile_limit = max(
            config.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT
        )
        with torch.inference_mode():
            for decoder in self.decoders:
                decoder.warm_up()
            for callback in self._after:
                note = callback()
                if note:
                    self.notes.append(note)
