"""Throughput of the PyTorch engine backend at concurrency 1, 4 and 8.

Run: ``python benchmarks/bench_engine.py [--threads N] [--device cpu|cuda] [--compile]``
(about a minute on two CPU cores; ``--smoke``: a tiny model, concurrency 1 and 2, a few
seconds). ``--compile`` runs every level again with ``engine.enable_torch_compile``
(inductor, batch buckets 1, 2, 4, 8, compiled before the clock starts), interleaved
with the eager engine level by level, each row saying which engine it was; on CUDA
the eager engine runs with ``engine.disable_cuda_graph``, the other with CUDA graphs.

The model is :class:`~omni_core.engine.toy_model.TinyDecoder` at a size where
a decode step is dominated by reading the weights (4 layers, width 512,
vocabulary 8192: 21 M parameters, 84 MB in float32), which is the regime of
real decoders at small batch sizes and the one continuous batching is for:
a step over 8 sequences reads the weights once, as a step over one does.

For each concurrency C, C clients each submit requests back to back (prompt
of 32 tokens, 64 new tokens, top-k 50 at temperature 0.9, its own seed) until
``--requests`` have been served; ``engine.max_running_requests`` is 8. The
clock runs from the first submit to the last output, after a warm-up request.
Figures: engine steps per second, generated tokens per second, and the
tokens/s gain over concurrency 1.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import anyio
import torch

from omni_core.engine.interface import EngineSettings, SamplingParams
from omni_core.engine.torch_engine import TorchEngine
from omni_core.engine.toy_model import TinyDecoder
from omni_core.sigterm import run_script

PROMPT, NEW_TOKENS = 32, 64
SMOKE_NEW_TOKENS = 8


async def run_level(
    engine: TorchEngine, concurrency: int, requests: int, new_tokens: int = NEW_TOKENS
) -> tuple[float, int, int]:
    """(seconds, tokens, steps) for ``requests`` requests from ``concurrency`` clients."""
    tokens = 0
    remaining = requests
    vocab = engine.model.vocab_size
    noise = torch.Generator().manual_seed(concurrency)

    async def client(index: int) -> None:
        nonlocal tokens, remaining
        while remaining > 0:
            remaining -= 1
            prompt = torch.randint(0, vocab, (PROMPT,), generator=noise).tolist()
            sampling = SamplingParams(
                temperature=0.9, top_k=50, seed=remaining, max_new_tokens=new_tokens
            )
            async for _ in engine.enqueue(f"c{concurrency}-{remaining}", prompt, sampling):
                tokens += 1

    steps = engine.steps
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for index in range(concurrency):
            tg.start_soon(client, index)
    return time.perf_counter() - started, tokens, engine.steps - steps


async def main(args: argparse.Namespace) -> None:
    # --smoke: a model small enough that the whole run takes a few seconds
    vocab, width, heads, layers = (512, 64, 4, 2) if args.smoke else (8192, 512, 8, 4)
    new_tokens = SMOKE_NEW_TOKENS if args.smoke else NEW_TOKENS
    levels = (1, 2) if args.smoke else (1, 4, 8)
    model = TinyDecoder(vocab, width, heads, layers, seed=0, device=args.device)
    params = sum(p.numel() for p in model.parameters())
    limits = dict(max_running_requests=8, max_total_tokens=8 * 128)
    modes = {"eager": EngineSettings(disable_cuda_graph=True, **limits)}
    if args.compile:
        modes["compiled"] = EngineSettings(enable_torch_compile=True, **limits)
    print(
        f"TinyDecoder: {params / 1e6:.1f} M parameters on {args.device}, "
        f"{torch.get_num_threads()} torch threads; prompt {PROMPT}, {new_tokens} new tokens"
    )
    print(
        f"{'engine':>8} {'concurrency':>11} {'requests':>8} {'seconds':>8} {'steps/s':>8} "
        f"{'tokens/s':>9} {'gain':>5}"
    )
    engines = {mode: TorchEngine(model, settings) for mode, settings in modes.items()}
    for mode, engine in engines.items():
        if engine.warm_up_seconds is not None:
            print(f"{mode:>8} {engine.static.reason}; compiled in {engine.warm_up_seconds:.1f} s")
    base = None
    async with contextlib.AsyncExitStack() as stack:
        for engine in engines.values():
            await stack.enter_async_context(engine)
            await run_level(engine, 1, 1, new_tokens)  # warm-up
        # interleaved: each level runs on every engine in turn, so a busy machine's
        # slow moments fall on both
        for concurrency in levels:
            requests = max(args.requests, concurrency)
            for mode, engine in engines.items():
                seconds, tokens, steps = await run_level(engine, concurrency, requests, new_tokens)
                rate = tokens / seconds
                base = base or rate
                print(
                    f"{mode:>8} {concurrency:>11} {requests:>8} {seconds:>8.2f} "
                    f"{steps / seconds:>8.1f} {rate:>9.1f} {rate / base:>4.1f}x"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one repeat: checks the script runs (make test)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also run with engine.enable_torch_compile and print both (gain: over eager c=1)",
    )
    arguments = parser.parse_args()
    if arguments.smoke:
        arguments.requests = 2
    torch.set_num_threads(arguments.threads)
    run_script(lambda: anyio.run(main, arguments))
