"""A codec decoder's streamed chunks captured as CUDA graphs, one per (rows, frames).

Why: on a GPU a streamed chunk of the codec (Qwen3-TTS's speech tokenizer
decoder, Qwen3-Omni's code2wav) is several hundred small kernels: eight
transformer layers over a few frames, then convolutions and activations
over a few thousand samples. Launching them one by one from Python costs
more than running them, and the three H200 leases measured a Qwen3-TTS
frame at concurrency 1 at about 24 ms, of which the engine took 16. Both
peers capture their codecs as CUDA graphs.

Why it can be captured: a :class:`~.streaming.StreamState` is a fixed set
of tensors per row (every causal convolution's tail, the transformer's
key/value window, ``valid`` and ``position``), so a chunk is a function of
(codes, the state's tensors) to (audio, the next state's tensors), with no
reading of the device. It is captured once per rows bucket (a batch is
padded up with rows the graph computes and nobody reads: no operation of
the decoder mixes rows) and per chunk length the vocoder asks for (its
schedule: 4, 8, 16, 32, 48 frames by default); a chunk of any other length
(a stream's last, a voice clone's reference) runs eagerly, as does a batch
above the largest bucket. Only shapes of at most ``max_frame_rows`` frames
across the rows are captured (:data:`MAX_FRAME_ROWS`): the graphs' shared
pool keeps the largest one's activations for good, about 3.7 MB a frame and
row at the release's size in float32 (``codec_footprint.py``, counted
allocation by allocation), so 16 rows of 48 frames would hold 2.9 GB, while
a shape that large is bound by its arithmetic, not by launching kernels,
which is all a graph saves.

A replay copies the streams' tensors into the graph's input buffers (one
concatenation per tensor of the state, whatever the rows), replays, and
copies the next state's tensors out of the graph's outputs (one copy per
tensor for the batch), since the next replay overwrites them. The audio is
the graph's own buffer: the caller copies it to the host before the next
decode (the vocoder does, at once).

Rows that start their streams: code2wav's left-trimmed layers make such a
row's first samples a lead that is cut (see ``streaming.py``). Inside a
graph every row's lead is tracked on the device (a continuing row's is 0,
which changes none of its samples), and the cuts come from the host's
:attr:`~.streaming.StreamState.fresh` flags.

Each graph is checked when captured: its replay against an eager run of the
same chunk on the same (random) codes and state. A graph that differs
raises, and the caller keeps the eager decode: a wrong capture may cost
speed, never audio.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from omni_core.engine.buckets import bucket_for

from ..codec_footprint import (
    MAX_FRAME_ROWS,
    captured_shapes,
    chunk_schedule,
    row_buckets,
    shapes_said,
)
from .streaming import StreamState

__all__ = ["MAX_FRAME_ROWS", "CapturedChunks", "StreamGraphs", "chunk_schedule", "row_buckets"]

#: Replay and eager run of a captured chunk must agree this closely (float32 codecs
#: replay the same kernels, bit for bit; bf16 ones may differ by a rounding).
CHECK_TOLERANCE = {"rtol": 1e-3, "atol": 1e-3}


class Replayable(Protocol):
    """What :data:`Capture` returns (``omni_core.engine.cuda_graphs.CapturedStep``)."""

    inputs: list[torch.Tensor]
    output: Any

    def replay(self) -> Any: ...


#: ``capture(fn, example)``: ``fn(*example)`` recorded once, replayed on its own input
#: buffers (``inputs``) into its own output buffers (``output``).
Capture = Callable[[Callable[..., Any], Sequence[torch.Tensor]], Replayable]


class CapturedChunks:
    """What every codec's captured chunks share: the row buckets, the bucket a batch goes
    to, and the log line (MOSS-TTS's codec: ``omni_moss_tts.codec.graphs``)."""

    rows: list[int]
    graphs: dict[tuple[int, int], Any]
    seconds: float
    replays: int  # chunks decoded by a graph (tests, figures)

    def decode(self, codes: torch.Tensor, streams: Sequence[Any]) -> list[torch.Tensor] | None:
        """Each row's audio of one chunk of ``streams`` through its graph, advancing them;
        None where no graph has the shape (the caller decodes eagerly)."""
        raise NotImplementedError

    def note(self) -> str:
        """What was captured, for the log: the shapes and how long it took."""
        return (
            f"streamed chunks captured as {len(self.graphs)} CUDA graphs (rows x frames: "
            f"{shapes_said(self.graphs)}{self.held_note()}) in {self.seconds:.1f} s, each "
            "checked against an eager chunk"
        )

    def held_note(self) -> str:
        """What the graphs hold beside their shapes, for :meth:`note` (nothing here)."""
        return ""

    def bucket(self, batch: int) -> int | None:
        """The smallest captured row count that holds ``batch`` rows, if any."""
        return bucket_for(batch, tuple(self.rows))

    def graph_for(self, codes: torch.Tensor, streams: Sequence[Any]) -> Any | None:
        """The graph of ``codes``' shape ``[B, K, T]`` (its rows bucketed), or None where none
        was captured: the caller decodes eagerly. ``streams`` hold the ``B`` rows."""
        batch, length = codes.shape[0], codes.shape[-1]
        if sum(s.batch for s in streams) != batch:
            raise ValueError(f"codes have {batch} rows, the streams {[s.batch for s in streams]}")
        bucket = self.bucket(batch)
        return None if bucket is None else self.graphs.get((bucket, length))


class StreamGraphs(CapturedChunks):
    """Captured chunks of ``decoder`` (a ``CodecDecoder``) for ``rows`` buckets x ``frames``."""

    def __init__(
        self,
        decoder: Any,
        rows: Sequence[int],
        frames: Sequence[int],
        capture: Capture,
        seed: int = 0,
        max_frame_rows: int | None = MAX_FRAME_ROWS,
    ):
        """Captures every ``rows`` x ``frames`` shape of at most ``max_frame_rows`` frames
        in all (None: every shape)."""
        self.decoder = decoder
        self.rows = sorted(set(rows))
        self.frames = sorted(set(frames))
        if not self.rows or self.rows[0] < 1 or not self.frames or self.frames[0] < 1:
            raise ValueError(f"rows {list(rows)} and frames {list(frames)} must be >= 1")
        param = next(decoder.parameters())
        self.device = param.device
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.tails, self.zeros = self._tail_layout()
        self.graphs: dict[tuple[int, int], Replayable] = {}
        self.replays = 0  # chunks decoded by a graph (tests, figures)
        started = time.perf_counter()
        with torch.inference_mode():
            # largest first, as the engine captures its buckets: the shared pool's
            # first graph sets its size, which the smaller ones then reuse
            for bucket, length in reversed(captured_shapes(self.rows, self.frames, max_frame_rows)):
                self.graphs[(bucket, length)] = self._capture(capture, bucket, length)
        if not self.graphs:
            raise ValueError(
                f"no chunk of rows {self.rows} x frames {self.frames} is within "
                f"{max_frame_rows} frames across its rows"
            )
        self.seconds = time.perf_counter() - started

    def decode(self, codes: torch.Tensor, streams: list[StreamState]) -> list[torch.Tensor] | None:
        """Codes ``[B, K, T]`` (on the decoder's device) of one row per stream -> each row's
        audio ``[1, N_row]`` (views of the graph's buffer), advancing every stream; ``None``
        where no graph has this shape (the caller decodes eagerly)."""
        batch = codes.shape[0]
        graph = self.graph_for(codes, streams)
        if graph is None:
            return None
        fresh = [f for s in streams for f in s.fresh]
        inputs = graph.inputs
        inputs[0][:batch].copy_(codes)
        states = [self._tensors(s) for s in streams]
        for slot, parts in enumerate(zip(*states, strict=True), start=1):
            if len(parts) == 1:
                inputs[slot][:batch].copy_(parts[0])
            else:
                torch.cat(parts, out=inputs[slot][:batch])
        wav, *after = graph.replay()
        self.replays += 1
        kept = [t[:batch].clone() for t in after]
        whole = StreamState.from_tensors(self.tails, kept, [False] * batch)
        sizes = [s.batch for s in streams]
        for stream, part in zip(streams, whole.split(sizes), strict=True):
            stream.adopt(part)
        lead = self.decoder.lookahead_samples
        return [wav[row, :, lead if f else 0 :] for row, f in enumerate(fresh)]

    # -- capture --------------------------------------------------------------------

    def _chunk(self, codes: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The captured function: one chunk of every row, the next state's tensors."""
        current = StreamState.from_tensors(self.tails, list(state), [False] * codes.shape[0])
        wav, _ = self.decoder._stream(codes, current, uniform=False, every_row=True)
        return (wav, *current.tensors(self.tails))

    def _capture(self, capture: Capture, bucket: int, length: int) -> Replayable:
        example = self._example(bucket, length)
        graph = capture(self._chunk, example)
        self._check(graph, bucket, length)
        return graph

    def _example(self, bucket: int, length: int) -> list[torch.Tensor]:
        """Random codes and a state one random chunk into its stream (not all zeros: a
        stale or wrong graph must show in :meth:`_check`)."""
        state = self.decoder.new_stream(bucket)
        self.decoder._stream(self._codes(bucket, 3), state, uniform=False)
        return [self._codes(bucket, length), *state.tensors(self.tails)]

    def _codes(self, bucket: int, length: int) -> torch.Tensor:
        cfg = self.decoder.cfg
        shape = (bucket, cfg.num_quantizers, length)
        codes = torch.randint(0, cfg.codebook_size, shape, generator=self.generator)
        return codes.to(self.device)

    def _check(self, graph: Replayable, bucket: int, length: int) -> None:
        """Replay on fresh inputs against an eager run of the same chunk; raise if they differ."""
        example = self._example(bucket, length)
        eager = self._chunk(*example)
        for buffer, value in zip(graph.inputs, example, strict=True):
            buffer.copy_(value)
        replayed = graph.replay()
        for i, (a, b) in enumerate(zip(replayed, eager, strict=True)):
            same = torch.equal(a, b) if not a.is_floating_point() else a.shape == b.shape
            if same and a.is_floating_point():
                same = torch.allclose(a.float(), b.float(), **CHECK_TOLERANCE)
            if not same:
                what = "the audio" if i == 0 else f"state tensor {i - 1}"
                raise RuntimeError(
                    f"the captured chunk of {bucket} row(s) x {length} frame(s) differs from "
                    f"the eager chunk in {what}"
                )

    def _tail_layout(self) -> tuple[list[nn.Module], dict[nn.Module, torch.Tensor]]:
        """The modules that carry a tail, in the order a chunk reaches them, and a zero
        tail of one row for each (a stream before its first chunk has none yet)."""
        with torch.inference_mode():
            state = self.decoder.new_stream(1)
            self.decoder._stream(self._codes(1, 1), state, uniform=False)
        tails = list(state.tails)
        return tails, {m: torch.zeros_like(state.tails[m]) for m in tails}

    def _tensors(self, stream: StreamState) -> list[torch.Tensor]:
        """A stream's state tensors, its tails completed with the zeros a first chunk pads."""
        missing = [m for m in self.tails if m not in stream.tails]
        if not missing:
            return stream.tensors(self.tails)
        tails = dict(stream.tails)
        for m in missing:
            tails[m] = self.zeros[m].expand(stream.batch, *self.zeros[m].shape[1:])
        return [*(tails[m] for m in self.tails), *stream.tensors([])]
