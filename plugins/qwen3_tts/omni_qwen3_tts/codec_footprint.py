"""What a streaming codec decoder holds on its device beyond its weights, from its geometry.

Why: the vocoder (and Qwen3-Omni's code2wav) decodes a batch of streams'
chunks at once, and on a GPU that batch was bounded by rows only (16) while
a chunk grows to 48 frames, so one call could allocate rows x 48 frames of
audio-rate activations: about 2.9 GB at the release's size, which the
planner's round 512 MiB allowance for the stage did not hold. This module
says, without torch, what a stream's state, a chunk and the captured graphs
take; the vocoder splits a batch into calls of at most :data:`CHUNK_MEMORY`
and the planner reserves what these figures add up to.

Measured, not guessed: a chunk's allocations were counted one by one on the
``meta`` device (``omni_core.kit.allocation_peak``, the code paths a GPU
takes) for the release's geometry and five variants (decoder width 768,
rates 4-4-4-2 and 8-5-3, transformer width 512, the tiny preset): each row
of a chunk peaks at its next state plus, per frame, 4.67 to 5.0 tensors of
the last decoder block's size (its channels x samples per frame), the
residual units' activations at the audio rate. :data:`FRAME_ACTIVATIONS`
takes 5 (tests hold the formula to the counted peak).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from omni_core.kit.memory import weights_only
from omni_core.placement import MemoryEstimate
from omni_core.plan.estimates import factory_dtype
from omni_core.schema.sizes import format_bytes

#: Tensors of the last decoder block's size alive at a chunk's peak, per frame and row.
FRAME_ACTIVATIONS = 5

#: Most bytes one eager decode call of the vocoder allocates: a batch whose chunk would
#: take more is decoded in calls of fewer rows (a 48-frame chunk of the release's codec
#: takes about 180 MB a row, so 5 rows a call). Large chunks are bound by arithmetic, so
#: the extra calls cost little, while a batch of 16 such rows would peak near 2.9 GB.
CHUNK_MEMORY = 1 << 30

#: Frames across the rows of the largest chunk a vocoder captures as a CUDA graph (rows x
#: frames): at the release's size its graphs then keep about 0.9 GB (:meth:`graph_bytes`:
#: 15 graphs at 16 rows, 1 x 4-48 up to 16 x 4).
MAX_FRAME_ROWS = 64

#: Bytes of each tensor element by dtype name (the planner's spelling and torch's).
ITEMSIZE = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


@dataclass(frozen=True)
class CodecFootprint:
    """One streaming codec's memory beyond its weights, in bytes."""

    state_bytes: int  # one stream's carried state (key/value window, convolution tails)
    frame_bytes: int  # a chunk's activation peak per frame and row
    samples_per_frame: int
    itemsize: int
    row_bytes: int = 0  # a chunk's activations per row whatever its frames (MOSS-TTS's codec)
    #: Captured chunks share one tensor of states for the largest bucket's rows and write
    #: the next state into it in place (MOSS-TTS's codec, whose state is most of a row).
    shared_state: bool = False
    #: Most rows a captured chunk has (None: every bucket); larger batches run eagerly.
    captured_rows: int | None = None

    def chunk_bytes(self, rows: int, frames: int) -> int:
        """The peak of one call decoding ``rows`` streams' chunks of ``frames`` frames."""
        return rows * (self.state_bytes + self.row_bytes + frames * self.frame_bytes)

    def rows_per_call(self, frames: int, budget: int = CHUNK_MEMORY) -> int:
        """How many rows of ``frames``-frame chunks one call may decode within ``budget``."""
        return max(1, budget // self.chunk_bytes(1, frames))

    def calls_peak(self, rows: int, frames: int, budget: int = CHUNK_MEMORY) -> int:
        """The peak of ``rows`` chunks decoded as the vocoder does: in calls within ``budget``."""
        return self.chunk_bytes(min(rows, self.rows_per_call(frames, budget)), frames)

    def graph_bytes(self, shapes: Iterable[tuple[int, int]]) -> int:
        """What captured chunks of ``shapes`` (rows, frames) keep: each graph's input and
        output state and audio, and their shared pool's activations (the largest chunk's);
        with :attr:`shared_state`, one state tensor for all of them instead. Shapes of more
        than :attr:`captured_rows` rows are not captured."""
        most = self.captured_rows
        shapes = [(r, t) for r, t in shapes if most is None or r <= most]
        if not shapes:
            return 0
        sample = self.samples_per_frame * self.itemsize
        audio = sum(rows * frames * sample for rows, frames in shapes)
        if self.shared_state:
            # one state tensor of the largest bucket; the pool holds a chunk's activations only
            pool = max(rows * (self.row_bytes + t * self.frame_bytes) for rows, t in shapes)
            return pool + max(rows for rows, _ in shapes) * self.state_bytes + audio
        pool = max(self.chunk_bytes(rows, frames) for rows, frames in shapes)
        return pool + sum(rows * 2 * self.state_bytes for rows, _ in shapes) + audio


def decoder_footprint(cfg: Any, width: int, embed_tail: int, itemsize: int) -> CodecFootprint:
    """The footprint of a ``CodecDecoder`` of geometry ``cfg`` (a ``DecoderConfig``).

    ``width``: the channels between its transformer and its decoder blocks;
    ``embed_tail``: the elements per row that its code embedding carries
    (Qwen3-TTS: ``pre_conv``'s two inputs of ``codebook_dim``; code2wav: none).
    The tails are every streamed convolution's left context, module by module
    as ``speech_tokenizer/decoder.py`` builds them.
    """
    rates = tuple(cfg.upsample_rates)
    ratios = tuple(cfg.upsampling_ratios)
    window = max(cfg.sliding_window - 1, 0)
    head_dim = cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * window * head_dim
    tails = embed_tail
    tails += len(ratios) * 6 * width  # each ConvNeXt block's depthwise kernel of 7
    tails += 6 * width  # the decoder's first convolution (kernel 7)
    for i in range(len(rates)):
        in_dim, out_dim = cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1)
        # the transposed convolution's one overlapping input, then residual units of
        # kernel 7 at dilations 1, 3 and 9
        tails += in_dim + 6 * (1 + 3 + 9) * out_dim
    last_dim = cfg.decoder_dim // 2 ** len(rates)
    tails += 6 * last_dim  # the final convolution to one channel
    samples = math.prod((*ratios, *rates))
    return CodecFootprint(
        state_bytes=(kv + tails) * itemsize + 2 * 8,  # valid and position: one int64 each
        frame_bytes=FRAME_ACTIVATIONS * last_dim * samples * itemsize,
        samples_per_frame=samples,
        itemsize=itemsize,
    )


def row_buckets(largest: int) -> list[int]:
    """Powers of two below ``largest``, and ``largest`` (1, 2, 4, 8, 16 for 16)."""
    buckets = [1]
    while buckets[-1] * 2 < largest:
        buckets.append(buckets[-1] * 2)
    return sorted({*buckets, largest})


def chunk_schedule(first: int, growth: int, largest: int) -> list[int]:
    """The chunk lengths a vocoder asks for: ``first``, then ``growth`` times the one
    before, up to ``largest`` (4, 8, 16, 32, 48 by default)."""
    lengths = [first]
    while growth > 1 and lengths[-1] < largest:
        lengths.append(min(lengths[-1] * growth, largest))
    return lengths


def shapes_said(shapes: Iterable[tuple[int, int]]) -> str:
    """Captured (rows, frames) shapes for a log line: ``1 x 2-8, 2 x 2-8, 4 x 2``."""
    lengths: dict[int, list[int]] = {}
    for rows, frames in sorted(shapes):
        lengths.setdefault(rows, []).append(frames)
    said = []
    for rows, of in lengths.items():
        said.append(f"{rows} x {of[0]}" if len(of) == 1 else f"{rows} x {of[0]}-{of[-1]}")
    return ", ".join(said)


def captured_shapes(rows: Iterable[int], frames: Iterable[int], max_frame_rows: int | None):
    """The (rows, frames) shapes a vocoder captures: every pair within ``max_frame_rows``."""
    return [
        (r, f)
        for r in sorted(set(rows))
        for f in sorted(set(frames))
        if max_frame_rows is None or r * f <= max_frame_rows
    ]


# -- what the planner reserves for a streaming vocoder stage -------------------------

#: Rows a vocoder decodes together on a GPU when ``factory.max_batch_size`` is unset.
GPU_BATCH = 16

#: A vocoder process's memory beyond its tensors: its CUDA context, the caching
#: allocator's rounding, kernels' workspaces (the whole allowance before the figures
#: below were counted).
PROCESS_SLACK = 512 << 20


def stage_overhead(
    factory: Any,
    footprint: CodecFootprint,
    growth: int = 2,
    chunk_memory: int | None = CHUNK_MEMORY,
    captured: bool = True,
    streams: int = 0,
) -> tuple[int, str]:
    """What a streaming vocoder stage keeps on its GPU beyond its weights, and the sum's
    parts for ``omni plan``.

    ``factory``: its ``StreamingVocoderArgs`` (``chunk_frames``, ``max_chunk_frames``,
    ``max_batch_size``, ``left_context_frames``, ``disable_cuda_graph``); ``growth``,
    ``chunk_memory`` and ``captured``: the stage's chunk growth, its calls' budget (None:
    a batch in one call) and whether it captures CUDA graphs. ``streams``: how many
    streams may be alive at once (the engine that feeds the stage runs as many
    requests: its ``engine.max_running_requests``); at least one batch's are counted.
    """
    rows = factory.max_batch_size or GPU_BATCH
    first = factory.chunk_frames
    largest = max(first, factory.max_chunk_frames or first)
    context = getattr(factory, "left_context_frames", None)
    frames = largest + (context or 0)  # a call's frames, its re-decoded context's included
    per_call = rows if chunk_memory is None else footprint.rows_per_call(frames, chunk_memory)
    per_call = min(rows, per_call)
    if context is not None:  # stateless: each call decodes its context again, keeps nothing
        chunks = footprint.chunk_bytes(per_call, frames)
        note = f"chunks {format_bytes(chunks)} ({rows} rows x {context} + {largest} frames)"
        return PROCESS_SLACK + chunks, note
    streams = max(streams, rows)
    state = streams * footprint.state_bytes
    chunks = footprint.chunk_bytes(per_call, largest)
    graphs = 0
    if captured and not getattr(factory, "disable_cuda_graph", False):
        shapes = captured_shapes(
            row_buckets(rows), chunk_schedule(first, growth, largest), MAX_FRAME_ROWS
        )
        graphs = footprint.graph_bytes(shapes)
    note = (
        f"chunks {format_bytes(chunks)} ({rows} rows x {largest} frames in calls of "
        f"{per_call}), {streams} streams' state {format_bytes(state)}"
        + (f", CUDA graphs {format_bytes(graphs)}" if graphs else "")
    )
    return PROCESS_SLACK + chunks + state + graphs, note


def vocoder_estimate(
    stage: Any,
    params: int,
    label: str,
    footprint: Callable[[int], CodecFootprint],
    feeder: Any = None,
    **stage_args: Any,
) -> MemoryEstimate:
    """A streaming vocoder stage's estimate: its codec's ``params`` weights in its
    ``factory.dtype`` (float32 by default, as all three releases keep their codecs) and
    :func:`stage_overhead` of ``footprint(itemsize)`` (``stage_args``: its other
    arguments), with as many streams as ``feeder``, the engine stage whose codes it
    decodes, runs requests."""
    found = weights_only(stage, params, overhead=0, label=label, default_dtype="float32")
    itemsize = ITEMSIZE.get(factory_dtype(stage, "float32"), 4)
    streams = running_requests(feeder)
    overhead, note = stage_overhead(
        stage.factory, footprint(itemsize), streams=streams, **stage_args
    )
    return replace(found, overhead_bytes=overhead, source=f"{found.source}; {note}")


def running_requests(engine_stage: Any) -> int:
    """The requests ``engine_stage`` runs at once (its ``engine.max_running_requests``,
    written or its backend's default; 0 when there is no such stage or it cannot say).

    Where the deploy file leaves it unwritten on a GPU, the plan sizes it from memory
    later, from these very estimates, and then asks again with the sized number
    written in (``omni_core.plan.caches.with_sized_requests``).
    """
    if engine_stage is None:
        return 0
    from omni_core.engine.backends import engine_settings
    from omni_core.errors import OmniError

    try:
        return engine_settings(engine_stage).max_running_requests
    except OmniError:  # the config checks say what is wrong with its settings
        return 0
