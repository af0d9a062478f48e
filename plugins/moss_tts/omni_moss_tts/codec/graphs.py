"""The MOSS codec's streamed chunks captured as CUDA graphs, one per (rows, frames).

Why: the release's decoder is 68 transformer layers (32 at width 1280, 36
at 768) between patch unfolds, so a streamed chunk is about a thousand
kernels, and a chunk of a few frames costs more to launch from Python than
to run. Both peers capture their codecs; Qwen3-TTS's vocoder captures its
own (``omni_qwen3_tts/speech_tokenizer/stream_graphs.py``).

Why it can be captured: an eager stream carries up to ``window - 1``
positions per layer, fewer while it is young, so its shapes change with
its age. A captured chunk carries full windows whatever the age: a young
row's are padded in front with zeros at negative positions, which the
attention mask excludes, as it excludes the padding of a batch of rows of
different ages. Each query attends to the keys it attends to eagerly, so
the audio is the eager audio within float rounding (the sums run over more,
masked, keys); the tests hold captured streams to eager ones chunk after
chunk.

Memory: at the release's size a row's full windows are about 170 MB in
float32. The graphs share one tensor of them for the largest bucket's rows
(:attr:`CodecStreamGraphs.state`, every layer's keys and values views of
it, ``streaming.window_views``), and a chunk writes its next windows there
in place (``ProjectedTransformer.run(in_place=True)``), so no graph keeps
state of its own: the captured shapes add that one tensor, their shared
pool's activations (a chunk's, with no state in it) and their audio
(``CodecFootprint.graph_bytes``, ``shared_state``).

After a replay each stream's windows are its rows of that tensor
(:attr:`~.streaming.CodecStream.flat`, views), so the usual next chunk, the
same streams in the same order, copies nothing in or out: a server's
concurrent requests advance chunk by chunk in step, and at the release's
size eight streams' windows are 1.35 GB to read and write twice a chunk
otherwise, as much traffic as the chunk's own weights. When another company
replays, the streams that held the rows first get copies of their own (one
copy a stream), and the new company's windows are copied in (one
concatenation; a stream no graph has decoded yet is written behind zeros,
``streaming.write_windows``).

A chunk of a length the schedule does not have (a stream's last, a voice
clone's reference) or a batch above the largest bucket runs eagerly, on
the full windows the graphs left or on its own growing ones: both paths
read either form. Each graph is checked when captured against an eager run
of the same function on the same random codes and windows, and one that
differs raises: the vocoder then decodes eagerly.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from omni_core.schema.sizes import format_bytes
from omni_qwen3_tts.codec_footprint import MAX_FRAME_ROWS, captured_shapes
from omni_qwen3_tts.speech_tokenizer.stream_graphs import CapturedChunks

from .streaming import CodecStream, window_views, window_width, write_windows

if TYPE_CHECKING:
    from .model import AudioTokenizer

#: Replay and eager run of a captured chunk must agree this closely (a float32 codec
#: replays the same kernels; a bf16 one may differ by a rounding).
CHECK_TOLERANCE = {"rtol": 1e-3, "atol": 1e-3}


class CodecStreamGraphs(CapturedChunks):
    """Captured chunks of ``codec`` (an ``AudioTokenizer``) for ``rows`` buckets x ``frames``.

    The interface is the Qwen codecs' ``StreamGraphs``' (their shared
    ``CapturedChunks``): :meth:`decode` returns each row's audio, or None where no
    graph has the shape; :meth:`note` says what was captured.
    """

    def __init__(
        self,
        codec: AudioTokenizer,
        rows: Sequence[int],
        frames: Sequence[int],
        capture: Any,
        seed: int = 0,
        max_frame_rows: int | None = MAX_FRAME_ROWS,
    ):
        self.codec = codec
        self.rows = sorted(set(rows))
        self.frames = sorted(set(frames))
        if not self.rows or self.rows[0] < 1 or not self.frames or self.frames[0] < 1:
            raise ValueError(f"rows {list(rows)} and frames {list(frames)} must be >= 1")
        shapes = captured_shapes(self.rows, self.frames, max_frame_rows)
        if not shapes:
            raise ValueError(
                f"no chunk of rows {self.rows} x frames {self.frames} is within "
                f"{max_frame_rows} frames across its rows"
            )
        param = next(codec.decoder.parameters())
        self.device = param.device
        self.shapes = codec.window_shapes()
        #: Every captured row's full windows: the graphs read and write these addresses.
        self.state = torch.zeros(
            max(r for r, _ in shapes), window_width(self.shapes), device=param.device,
            dtype=param.dtype,
        )  # fmt: skip
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        # the windows' random examples are drawn where they live: at the release's size a
        # bucket of 8 rows is 340 M values, seconds on the CPU's generator
        self.device_generator = torch.Generator(device=param.device).manual_seed(seed)
        self.graphs: dict[tuple[int, int], Any] = {}
        self.replays = 0  # chunks decoded by a graph (tests, figures)
        self.copied_in = 0  # streams whose windows a replay had to copy in (tests, figures)
        self.copied_out = 0  # streams given their own copy before another company replayed
        #: The streams whose windows are rows of :attr:`state` (in row order) and their
        #: versions then: the company of the last replay. Weak: a stream whose request
        #: has ended is not kept, nor copied out.
        self.held: list[tuple[weakref.ref[CodecStream], int]] = []
        started = time.perf_counter()
        with torch.inference_mode():
            for bucket, length in reversed(shapes):  # largest first: it sets the pool's size
                self.graphs[(bucket, length)] = self._capture(capture, bucket, length)
        self.seconds = time.perf_counter() - started

    def held_note(self) -> str:
        """The one state tensor the graphs share (``CapturedChunks.note``)."""
        shared = format_bytes(self.state.nbytes)
        return f"; full windows of {self.state.shape[0]} rows shared, {shared}"

    def decode(self, codes: torch.Tensor, streams: list[CodecStream]) -> list[torch.Tensor] | None:
        """Codes ``[B, Q, T]`` (on the codec's device) of the rows of ``streams`` -> each row's
        audio ``[1, T * 1920]`` (views of the graph's buffer, in the decoder's dtype),
        advancing every stream; None where no graph has this shape."""
        batch, length = codes.shape[0], codes.shape[-1]
        graph = self.graph_for(codes, streams)
        if graph is None:
            return None
        codes_in, position_in = graph.inputs
        codes_in[:batch].copy_(codes)
        if not self._holds(streams):
            self._release()
            flats = [s.flat for s in streams]
            if len(streams) > 1 and all(f is not None for f in flats):
                torch.cat(flats, out=self.state[:batch])  # type: ignore[arg-type]
            else:  # one stream, or some that no graph has decoded yet (most: fresh ones)
                row = 0
                for stream in streams:
                    write_windows(self.state[row : row + stream.batch], stream, self.shapes)
                    row += stream.batch
            self.copied_in += len(streams)
        torch.cat([s.position for s in streams], out=position_in[:batch])
        wav = graph.replay()
        self.replays += 1
        advanced = position_in[:batch] + length
        row = 0
        for stream in streams:
            rows = slice(row, row + stream.batch)
            windows = self.state[rows]  # the stream's own until another company replays
            part = CodecStream(stream.batch, window_views(windows, self.shapes), advanced[rows])
            part.flat = windows
            stream.adopt(part)
            stream.version += 1  # changed: views split from it earlier are no longer its rows
            row += stream.batch
        self.held = [(weakref.ref(stream), stream.version) for stream in streams]
        return [wav[r : r + 1] for r in range(batch)]

    def _holds(self, streams: list[CodecStream]) -> bool:
        """Whether the shared windows are ``streams``' own, in this order, as the last replay
        left them: then nothing is copied in. Each stream's windows must still be its rows
        there (an eager chunk of several streams hands each new windows of its own
        without a version of its own changing), at the same version (one of its own)."""
        if len(streams) != len(self.held):
            return False
        row = 0
        for stream, (held, version) in zip(streams, self.held, strict=True):
            flat = stream.flat
            if stream is not held() or stream.version != version or flat is None:
                return False
            if flat.data_ptr() != self.state[row].data_ptr():
                return False
            row += stream.batch
        return True

    def _release(self) -> None:
        """Give the streams whose windows are rows of the shared tensor copies of their own,
        before another company's windows overwrite those rows (one copy a stream)."""
        for held, version in self.held:
            stream = held()
            if stream is not None and stream.version == version and stream.flat is not None:
                own = stream.flat.clone()
                stream.kv, stream.flat = window_views(own, self.shapes), own
                self.copied_out += 1
        self.held = []

    # -- capture --------------------------------------------------------------------

    def _chunk(self, codes: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """The captured function: one chunk of every row, on (and into) the shared windows."""
        windows = window_views(self.state[: codes.shape[0]], self.shapes)
        return self.codec.decode_window(codes, position, windows)

    def _capture(self, capture: Any, bucket: int, length: int) -> Any:
        codes, position, _ = self._example(bucket, length)
        graph = capture(self._chunk, [codes, position])
        self._check(graph, bucket, length)
        return graph

    def _example(self, bucket: int, length: int) -> tuple[torch.Tensor, ...]:
        """Random codes, positions (young rows among them, whose windows are part padding)
        and windows: not zeros, so that a stale or wrong graph shows in :meth:`_check`."""
        cfg = self.codec.cfg
        shape = (bucket, cfg.num_quantizers, length)
        codes = torch.randint(0, cfg.codebook_size, shape, generator=self.generator)
        position = torch.randint(0, 4 * max(s[2] for s in self.shapes) + 2, (bucket,),
                                 generator=self.generator)  # fmt: skip
        windows = torch.randn(
            bucket, self.state.shape[1], generator=self.device_generator, device=self.device,
            dtype=self.state.dtype,
        )  # fmt: skip
        return codes.to(self.device), position.to(self.device), windows

    def _check(self, graph: Any, bucket: int, length: int) -> None:
        """Replay on fresh inputs against an eager run of the same chunk; raise if they differ."""
        codes, position, windows = self._example(bucket, length)
        self._release()
        self.state[:bucket].copy_(windows)
        eager = self._chunk(codes, position).clone()
        eager_windows = self.state[:bucket].clone()
        self.state[:bucket].copy_(windows)
        graph.inputs[0].copy_(codes)
        graph.inputs[1].copy_(position)
        replayed = graph.replay()
        for what, a, b in (("the audio", replayed, eager),
                           ("the next windows", self.state[:bucket], eager_windows)):  # fmt: skip
            if a.shape != b.shape or not torch.allclose(a.float(), b.float(), **CHECK_TOLERANCE):
                raise RuntimeError(
                    f"the captured chunk of {bucket} row(s) x {length} frame(s) differs from "
                    f"the eager chunk in {what}"
                )
