"""The Qwen3-Omni thinker on the torch backend vs SGLang, through omni's runtime.

Run in the SGLang environment (``make sglang-env``; on a CPU with
``SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tests/support/sglang``)::

    .venv-sglang/bin/python benchmarks/bench_thinker_backends.py [--deploy F] [--levels 1,8]

Both sides serve the same deploy file (default: the qwen3-omni-text demo,
dummy weights) and the same greedy requests; each level sends that many
requests at once, twice, and reports generated tokens per second of wall
time. The ratio is sglang / torch on this machine in one run. On a CPU
SGLang runs on pure-torch fallbacks (no kernels), so expect it no faster; on a
GPU pass a GPU deploy file (for example ``examples/qwen3_omni_text.toml`` with
a real checkpoint) and the same script measures SGLang's kernels and graphs.

``--smoke``: 4 tokens at concurrency 1 and 2, once, on the torch backend alone
(SGLang is the reference here): it checks that the script still runs, in
omni's own environment too (``make test``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from omni_core.sigterm import run_script

ROOT = Path(__file__).resolve().parents[1]


def _request(tokens: int) -> dict[str, Any]:
    content = "Tell me about the sea. " * 4
    return {
        "messages": [{"role": "user", "content": content}],
        "sampling": {"max_tokens": tokens, "temperature": 0},
    }


async def _one(runtime: Any, data: dict) -> int:
    handle = await runtime.dispatch(data)
    tokens = 0
    async for event in handle.stream():
        if event.stage == "decode" and event.final:
            tokens = int(event.data["usage"]["completion_tokens"])
    return tokens


async def _side(
    deploy: Path, flags: list[str], levels: list[int], tokens: int, tries: int = 2
) -> dict:
    from omni_core.harness import plan_on_cpu
    from omni_core.plugins import OmniPlugins

    results: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="omni-bench-") as base:
        policy = "cpu" if "demo" in deploy.stem else None
        planned = plan_on_cpu(OmniPlugins(), base, deploy=deploy, flags=flags, policy=policy)
        async with planned.runtime() as runtime:
            await _one(runtime, _request(4))  # warm-up
            for level in levels:
                best = 0.0
                for _ in range(tries):
                    counts: list[int] = []
                    started = time.perf_counter()

                    async def run(counts: list[int] = counts) -> None:
                        counts.append(await _one(runtime, _request(tokens)))

                    async with anyio.create_task_group() as tg:
                        for _ in range(level):
                            tg.start_soon(run)
                    best = max(best, sum(counts) / (time.perf_counter() - started))
                results[level] = best
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deploy", type=Path, default=ROOT / "examples/qwen3_omni_text_demo.toml")
    parser.add_argument("--levels", default="1,8", help="concurrency levels")
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per request")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="4 tokens at concurrency 1 and 2, once, torch backend alone: checks the script runs",
    )
    args = parser.parse_args()
    if args.smoke:
        torch_side = anyio.run(_side, args.deploy, [], [1, 2], 4, 1)
        print(f"thinker tokens/s, {args.deploy.name}, 4 new tokens per request (--smoke: torch)")
        print(f"{'c':>3} {'torch':>10}")
        for level, rate in torch_side.items():
            print(f"{level:>3} {rate:>10.1f}")
        return 0
    try:
        import sglang  # noqa: F401
    except ImportError:
        # `make bench` runs every script in omni's own environment: skip, saying where.
        print("skipped: SGLang is not installed here; run it in .venv-sglang (make sglang-env)")
        return 0
    levels = [int(x) for x in args.levels.split(",")]
    torch_side = anyio.run(_side, args.deploy, [], levels, args.tokens)
    sglang_side = anyio.run(
        _side, args.deploy, ["--thinker.engine.backend", "sglang"], levels, args.tokens
    )
    print(f"thinker tokens/s, {args.deploy.name}, {args.tokens} new tokens per request")
    print(f"{'c':>3} {'torch':>10} {'sglang':>10} {'sglang/torch':>13}")
    for level in levels:
        a, b = torch_side[level], sglang_side[level]
        print(f"{level:>3} {a:>10.1f} {b:>10.1f} {b / a:>12.2f}x")
    return 0


if __name__ == "__main__":
    run_script(main)
