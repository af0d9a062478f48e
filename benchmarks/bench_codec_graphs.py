"""Streamed codec chunks, eager against captured as CUDA graphs, per chunk shape.

Run on a GPU: ``python benchmarks/bench_codec_graphs.py [--device cuda:N]``
(Qwen3-TTS 0.6B's speech tokenizer decoder at its release size, float32 as
the vocoder stage keeps it, dummy weights; under a minute). Without a CUDA
device and without ``--device`` it says so and exits 0, so that ``make
bench`` runs on the CPU. ``--smoke``: the
tiny decoder on the CPU, where the graphs' stand-in
(``omni_core.engine.cuda_graphs.FixedAddressReplay``) replays eagerly, one
pass: it checks the script runs, its figures mean nothing.

Why: the vocoder decodes its streams' chunks eagerly or through CUDA graphs
(``omni_qwen3_tts.speech_tokenizer.stream_graphs``; the stage's
``factory.disable_cuda_graph`` chooses). This prints what the graphs save:
for each rows x frames shape, the milliseconds of one chunk through the
vocoder's own ``decode_streams`` (the streams' state in and out, the audio
on the host) both ways, alternated, the median of ``--repeats`` each, and
the ratio (and on the GPU an eager chunk's peak memory, per frame and row),
every shape captured (a served vocoder captures only those of at
most ``stream_graphs.MAX_FRAME_ROWS`` frames across their rows; this says
whether the larger would pay). ``benchmarks/gpu_check.py`` prints it beside
its Qwen3-TTS rows.

``--codec moss-tts``: MOSS-TTS's codec instead (``omni_moss_tts.codec.graphs``:
full windows in one shared tensor), at the release's size from the codec's
released ``config.json`` (``bench_moss_tts.codec_config``: ``MOSS_TTS_REF_SRC``
or the fetched mirror; exit 2 where neither is here), its chunks 2 to 48
frames, each stream first decoded a window's length in (``--moss-age``
frames: its windows full, as a stream some seconds old has them).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from omni_core.sigterm import run_script

#: (rows, frames): the first chunk of one stream and of eight, the longest chunk of each
SHAPES = ((1, 4), (1, 48), (8, 4), (8, 48))
SMOKE_SHAPES = ((1, 2), (2, 4))
#: MOSS-TTS's: its stage's first chunk (2 frames) and its later ones (8, 32), one stream
#: and eight (the most rows it captures by default: its vocoder's cuda_graph_max_bs)
MOSS_SHAPES = ((1, 2), (1, 8), (1, 32), (8, 2), (8, 8))
MOSS_SMOKE_SHAPES = ((1, 2), (2, 8))


def load_decoder(device: str, smoke: bool) -> Any:
    """The release-size decoder (or the tiny preset's) with dummy weights on ``device``."""
    from omni_qwen3_tts.stages import load_codec

    if smoke:
        return load_codec("tiny", "dummy", None, device, 0).decoder
    import bench_qwen3_tts

    with tempfile.TemporaryDirectory(prefix="bench-codec-graphs-") as tmp:
        bench_qwen3_tts.write_configs(Path(tmp), 64)
        return load_codec(tmp, "dummy", None, device, 0).decoder


def load_moss_codec(device: str, smoke: bool) -> Any:
    """MOSS-TTS's codec at the release's size (or the tiny test codec), dummy weights, on
    ``device``, as its vocoder stage loads it (``omni_moss_tts.loading.load_codec``)."""
    import json

    from omni_moss_tts.codec import tiny_codec_config
    from omni_moss_tts.loading import load_codec

    if smoke:
        config = tiny_codec_config()
    else:
        import bench_moss_tts

        config = bench_moss_tts.codec_config(bench_moss_tts.DEFAULT_REF_SRC)
    with tempfile.TemporaryDirectory(prefix="bench-codec-graphs-moss-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        return load_codec("tiny", tmp, "dummy", torch.device(device), 0)


def vocoders(decoder: Any, shapes: tuple[tuple[int, int], ...], smoke: bool) -> tuple[Any, Any]:
    """The vocoder stage's code decoding eagerly, and through graphs of ``shapes``."""
    from omni_qwen3_tts.speech_tokenizer.stream_graphs import StreamGraphs, row_buckets
    from omni_qwen3_tts.stages import Vocoder

    rows = max(r for r, _ in shapes)
    lengths = sorted({f for _, f in shapes})
    moss = hasattr(decoder, "stream_graphs")  # MOSS-TTS's codec captures its own chunks
    # MOSS-TTS's vocoder: a batch in one call, chunks growing fourfold (stages.create_vocoder)
    how: dict[str, Any] = {"chunk_growth": 4, "chunk_memory": None} if moss else {}
    eager = Vocoder(decoder, lengths[0], None, max_batch_size=rows, cuda_graph=False, **how)
    captured = Vocoder(decoder, lengths[0], None, max_batch_size=rows, cuda_graph=False, **how)
    if smoke:
        from omni_core.engine.cuda_graphs import FixedAddressReplay

        capture: Any = FixedAddressReplay
    else:
        from omni_core.engine.cuda_graphs import CapturedStep, graph_pool

        pool = graph_pool(next(decoder.parameters()).device)

        def capture(fn: Any, example: Any) -> Any:
            return CapturedStep(fn, example, pool=pool)

    # the shapes asked for, as the vocoder captures its schedule's (stream_graphs.py)
    # every shape, the vocoder's cap (MAX_FRAME_ROWS) aside: the table says where it pays
    if moss:
        captured.graphs = decoder.stream_graphs(row_buckets(rows), lengths, capture, None)
    else:
        captured.graphs = StreamGraphs(
            decoder, row_buckets(rows), lengths, capture, max_frame_rows=None
        )
    captured.graph_note = captured.graphs.note()
    return eager, captured


#: Frames a MOSS-TTS stream is decoded before its timed chunk (``--moss-age``): 10
#: seconds, the release's windows full at every rate.
MOSS_AGE = 125


def chunk_ms(vocoder: Any, decoder: Any, rows: int, frames: int, seed: int, age: int = 0) -> float:
    """One chunk of ``rows`` streams already a chunk (or ``age`` frames) in, through
    ``decode_streams``."""
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, decoder.cfg.num_quantizers, frames)
    codes = torch.randint(0, decoder.cfg.codebook_size, shape, generator=gen)
    streams = [decoder.new_stream() for _ in range(rows)]
    if age:  # eagerly, a window's length in: the state a stream some seconds old carries
        older = (rows, decoder.cfg.num_quantizers, age)
        past = torch.randint(0, decoder.cfg.codebook_size, older, generator=gen)
        rows_state = type(streams[0]).stack(streams)
        decoder.stream_rows(past.to(next(decoder.parameters()).device), rows_state)
        for stream, part in zip(streams, rows_state.split([1] * rows), strict=True):
            stream.adopt(part)
    vocoder.decode_streams(codes, streams)  # past the first chunk: every tail exists
    started = time.perf_counter()
    vocoder.decode_streams(codes, streams)  # ends with the audio on the host
    return 1e3 * (time.perf_counter() - started)


def compare(
    decoder: Any, shapes: tuple[tuple[int, int], ...], repeats: int, smoke: bool, age: int = 0
) -> str:
    """The table: per shape, eager and captured ms a chunk (median), the ratio, and on a GPU
    the eager chunk's peak memory above what was allocated before it, beside what the
    planner counts for it (``codec_footprint.CodecFootprint.calls_peak``: a batch over
    ``CHUNK_MEMORY`` decodes in several calls), and per frame and row; the graphs' pool,
    reserved for good, is in the first line beside its estimate."""
    device = next(decoder.parameters()).device
    on_gpu = device.type == "cuda"
    reserved = torch.cuda.memory_reserved(device) if on_gpu else 0
    eager, captured = vocoders(decoder, shapes, smoke)
    footprint = eager.footprint
    estimated = footprint.graph_bytes(captured.graphs.graphs) if captured.graphs else 0
    pool = (
        f", graph pool {(torch.cuda.memory_reserved(device) - reserved) / 2**20:.0f} MiB "
        f"(codec_footprint: {estimated / 2**20:.0f} MiB)"
    )
    lines = [f"codec chunks: {captured.graph_note}" + (pool if on_gpu else "")]
    head = f"{'rows':>5} {'frames':>7} {'eager ms':>9} {'graph ms':>9} {'speed-up':>9}"
    memory = f" {'eager peak MiB':>15} {'estimate MiB':>13} {'MiB/frame-row':>14}"
    lines.append(head + (memory if on_gpu else ""))
    with torch.inference_mode():
        for rows, frames in shapes:
            times: dict[str, list[float]] = {"eager": [], "graph": []}
            for i in range(repeats + 1):  # the first of each: untimed warm-up
                for name, vocoder in (("eager", eager), ("graph", captured)):
                    ms = chunk_ms(vocoder, decoder, rows, frames, seed=i, age=age)
                    if i:
                        times[name].append(ms)
            a, b = statistics.median(times["eager"]), statistics.median(times["graph"])
            line = f"{rows:>5} {frames:>7} {a:>9.2f} {b:>9.2f} {a / b:>8.2f}x"
            if on_gpu:
                peak = eager_peak_bytes(eager, decoder, rows, frames) / 2**20
                guess = footprint.calls_peak(rows, frames) / 2**20  # what the planner counts
                line += f" {peak:>15.0f} {guess:>13.0f} {peak / (rows * frames):>14.1f}"
            lines.append(line)
    return "\n".join(lines)


def eager_peak_bytes(vocoder: Any, decoder: Any, rows: int, frames: int) -> int:
    """CUDA memory an eager chunk allocates at its peak beyond what was allocated before."""
    device = next(decoder.parameters()).device
    gen = torch.Generator().manual_seed(99)
    shape = (rows, decoder.cfg.num_quantizers, frames)
    codes = torch.randint(0, decoder.cfg.codebook_size, shape, generator=gen)
    streams = [decoder.new_stream() for _ in range(rows)]
    vocoder.decode_streams(codes, streams)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    vocoder.decode_streams(codes, streams)
    return torch.cuda.max_memory_allocated(device) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", default=None, help="cuda or cuda:N (default: cuda where there is one)"
    )
    parser.add_argument("--repeats", type=int, default=10, help="timed chunks per shape and way")
    parser.add_argument("--smoke", action="store_true", help="tiny, on the CPU, one pass")
    parser.add_argument(
        "--codec",
        choices=("qwen3-tts", "moss-tts"),
        default="qwen3-tts",
        help="Qwen3-TTS 0.6B's speech tokenizer decoder, or MOSS-TTS's codec",
    )
    parser.add_argument(
        "--moss-age",
        type=int,
        default=MOSS_AGE,
        help="MOSS-TTS: frames each stream is decoded before its timed chunk",
    )
    args = parser.parse_args()
    if args.device is None and not args.smoke and not torch.cuda.is_available():
        # make bench runs every script as it is: here there is nothing to capture
        print("no CUDA device here: no CUDA graph to time (--smoke runs the CPU's stand-in)")
        return
    device = "cpu" if args.smoke else args.device or "cuda"
    if not device.startswith("cuda") and not args.smoke:
        parser.error("a CUDA graph needs --device cuda (or --smoke, for the CPU's stand-in)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device}: torch sees no CUDA device here (try --smoke)")
    repeats = 1 if args.smoke else args.repeats
    if args.codec == "moss-tts":
        try:
            codec = load_moss_codec(device, args.smoke)
        except FileNotFoundError as exc:  # the codec's released config.json is not here
            parser.error(f"--codec moss-tts: {exc} (set MOSS_TTS_REF_SRC)")
        shapes = MOSS_SMOKE_SHAPES if args.smoke else MOSS_SHAPES
        age = 3 if args.smoke else args.moss_age
        print(compare(codec, shapes, repeats, args.smoke, age=age))
        return
    decoder = load_decoder(device, args.smoke)
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    print(compare(decoder, shapes, repeats, args.smoke))


if __name__ == "__main__":
    run_script(main)
