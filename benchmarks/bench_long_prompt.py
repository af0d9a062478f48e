"""A long prompt arriving while others decode: the Qwen3-Omni thinker's engine with the
prompt prefilled in one step and in chunks (``engine.chunked_prefill_size``).

Run: ``python benchmarks/bench_long_prompt.py [--layers 2] [--dtype bfloat16]
[--prompt 4096] [--chunk 512] [--decoders 4] [--answer 48] [--threads 2]`` (about a
minute on two CPU cores at two layers); ``--smoke``: tiny widths, seconds.

What runs: the thinker's decoder at the release's width (``bench_conversation``'s
build: hidden 2048, 128 experts top-8) with ``--layers`` layers and seeded random
weights, on the ``TorchEngine`` the thinker stage runs. ``--decoders`` requests with
short prompts start and decode ``--answer`` greedy tokens each; once each has its
first token, one request with a ``--prompt``-token prompt arrives. In one step, its
prefill holds every running request for as long as it takes; in chunks of
``--chunk`` positions, the running requests decode a token between chunks. Printed
per setting: the running requests' longest wait between two tokens and their median,
the long request's time to first token, and the whole run's wall time. Each setting
runs ``--repeats`` times, taking turns; each figure's best run is kept.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import anyio

from omni_core.engine.backends import create_engine
from omni_core.engine.interface import EngineSettings, SamplingParams
from omni_core.sigterm import run_script
from omni_qwen3_omni.thinker.step import ThinkerStepModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_conversation as conversation  # the thinker's build and prompts
import bench_qwen3_omni_thinker as thinker_bench  # its vocabulary


async def run_once(
    model: ThinkerStepModel,
    short: list[list[int]],
    long: list[int],
    answer: int,
    chunk: int | None,
) -> dict[str, float]:
    """One run: the short requests' token gaps (s), the long one's first token (s)."""
    settings = EngineSettings(
        max_running_requests=len(short) + 1,
        max_total_tokens=(len(short) + 1) * (len(long) + answer + 16),
        max_prefill_tokens=len(long),
        chunked_prefill_size=chunk if chunk is not None else -1,
    )
    gaps: list[float] = []
    started = anyio.Event()
    firsts = 0
    out: dict[str, float] = {}
    async with create_engine(model, settings, device="cpu") as engine:
        warm = SamplingParams(0.0, max_new_tokens=2)  # the first call at a shape pays more
        _ = [t async for t in engine.enqueue("warm", conversation.prompt_of([11, 12, 13]), warm)]

        async def decode(name: str, ids: list[int]) -> None:
            nonlocal firsts
            last = None
            sampling = SamplingParams(0.0, max_new_tokens=answer)
            async for _ in engine.enqueue(name, conversation.prompt_of(ids), sampling):
                now = time.perf_counter()
                if last is None:
                    firsts += 1
                    if firsts == len(short):
                        started.set()
                elif started.is_set():
                    gaps.append(now - last)
                last = now

        async def arrive() -> None:
            await started.wait()
            begin = time.perf_counter()
            sampling = SamplingParams(0.0, max_new_tokens=4)
            async for _ in engine.enqueue("long", conversation.prompt_of(long), sampling):
                out.setdefault("long_first_token_s", time.perf_counter() - begin)

        begin = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for number, ids in enumerate(short):
                tg.start_soon(decode, f"short{number}", ids)
            tg.start_soon(arrive)
        out["wall_s"] = time.perf_counter() - begin
    out["longest_gap_s"] = max(gaps)
    out["median_gap_s"] = statistics.median(gaps)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    conversation.add_thinker_arguments(parser)
    parser.add_argument("--prompt", type=int, default=4096, help="the long prompt's tokens")
    parser.add_argument("--chunk", type=int, default=512, help="chunked_prefill_size")
    parser.add_argument("--decoders", type=int, default=4, help="requests decoding meanwhile")
    parser.add_argument("--short", type=int, default=32, help="their prompts' tokens")
    parser.add_argument("--answer", type=int, default=48, help="their answers' tokens (greedy)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny widths, a short prompt: checks the script runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.prompt, args.chunk, args.decoders, args.answer, args.repeats = 96, 32, 2, 12, 1
    if not 1 <= args.chunk < args.prompt:
        print(f"--chunk must be in 1..{args.prompt - 1} (below --prompt)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    built = conversation.thinker_of(args)
    if built is None:
        return 2
    model, dtype = built
    rng = random.Random(args.seed)

    def text(n: int) -> list[int]:
        return [rng.randrange(thinker_bench.PLAIN_VOCAB) for _ in range(n)]

    short = [text(args.short) for _ in range(args.decoders)]
    long = text(args.prompt)
    width = "a tiny" if args.smoke else "the release's"
    print(
        f"Qwen3-Omni thinker at {width} width, {args.layers} of 48 layers, "
        f"{str(dtype).removeprefix('torch.')}, {args.threads} torch thread(s), built in "
        f"{time.perf_counter() - started:.1f} s; {args.decoders} requests decoding "
        f"{args.answer} tokens when a {args.prompt}-token prompt arrives"
    )
    settings = {"one step": None, f"chunks of {args.chunk}": args.chunk}
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.repeats):
        for name, chunk in settings.items():
            got = anyio.run(run_once, model, short, long, args.answer, chunk)
            old = best.get(name, got)
            best[name] = {key: min(old[key], got[key]) for key in got}
    print(
        "\nprefill of the long prompt  running requests: longest wait s  median s  "
        "long prompt's first token s  wall s"
    )
    for name, row in best.items():
        print(
            f"{name:<26}  {row['longest_gap_s']:>33.3f}  {row['median_gap_s']:>8.3f}  "
            f"{row['long_first_token_s']:>27.3f}  {row['wall_s']:>6.2f}"
        )
    whole, chunked = best["one step"], best[f"chunks of {args.chunk}"]
    print(
        f"longest wait {whole['longest_gap_s'] / chunked['longest_gap_s']:.1f}x shorter in "
        f"chunks; the long prompt's first token "
        f"{chunked['long_first_token_s'] / whole['long_first_token_s']:.2f}x as late"
    )
    conversation.print_record(
        args,
        dtype,
        prompt=args.prompt,
        chunk=args.chunk,
        decoders=args.decoders,
        one_step=whole,
        chunked=chunked,
    )
    return 0


if __name__ == "__main__":
    run_script(main)
