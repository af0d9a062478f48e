"""How long a compiled thinker stage takes to be ready: each decoder layer built once, or
the whole step as one graph, with a cold and with a warm inductor cache.

Run: ``python benchmarks/bench_compile_start.py [--layers 8] [--dtype bfloat16]
[--max-bs 8] [--threads 2]`` (minutes: the whole-graph cold start dominates);
``--smoke``: a tiny thinker, bucket 1, each layer built once, a cold start only, seconds;
``--cache-dir DIR``: compile against DIR instead of a new empty directory, so a start is
only as cold as DIR is (``make test``'s smoke run passes the suite's own cache: the
script's path is what it checks, and a cold compile there cost 20 s of CPU).

What runs: the Qwen3-Omni thinker's decoder (``bench_conversation``'s build: the
release's width, 128 experts top-8, seeded random weights, ``--layers`` layers) on
the ``TorchEngine`` its stage runs, with ``engine.enable_torch_compile`` and batch
buckets 1, 2, 4 ... ``--max-bs``, every bucket compiled (one graph for all its attention
spans, a dynamic size) and run at each span before
the engine is ready, as a stage process does before it says so. Each start runs in
a fresh interpreter (dynamo keeps what it traced per process), first with
``TORCHINDUCTOR_CACHE_DIR`` a new directory (cold), then with the same directory
again (warm), under ``OMNI_COMPILE_REGIONS=1`` (each layer traced and built once,
``omni_core/engine/layer_regions.py``) and ``=0`` (the step as one graph). Printed:
the seconds to ready of each (the engine's ``warm_up_seconds``) and their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio

from omni_core.sigterm import run_script

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_conversation as conversation  # the thinker's build

MARK = "START_SECONDS"


def start_once(args: argparse.Namespace) -> int:
    """One start in this interpreter: build, compile every bucket, print the seconds."""
    from omni_core.engine.backends import create_engine
    from omni_core.engine.interface import EngineSettings

    built = conversation.thinker_of(args)
    if built is None:
        return 2
    model, _ = built
    settings = EngineSettings(
        max_running_requests=args.max_bs,
        max_total_tokens=args.max_bs * args.slot,
        enable_torch_compile=True,
        cuda_graph_max_bs=args.max_bs,
    )
    engine = create_engine(model, settings, device="cpu")
    print(f"{MARK} {engine.warm_up_seconds:.2f}", flush=True)
    anyio.run(engine.aclose)
    return 0


def timed_start(args: argparse.Namespace, regions: bool, cache: Path) -> float:
    """One start in a fresh interpreter with ``cache`` as inductor's cache; its seconds."""
    command = [sys.executable, __file__, "--child", *child_arguments(args)]
    env = {
        **os.environ,
        "OMNI_COMPILE_REGIONS": "1" if regions else "0",
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
    }
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"a start with OMNI_COMPILE_REGIONS={int(regions)} failed")
    notes = [line for line in done.stderr.splitlines() if "each layer compiled on its own" in line]
    if regions and notes:  # a fallback would measure the whole graph twice
        raise SystemExit(f"the layers were not built once: {notes[0]}")
    return float(lines[-1].split()[1])


def child_arguments(args: argparse.Namespace) -> list[str]:
    flags = [
        f"--layers={args.layers}",
        f"--dtype={args.dtype}",
        f"--threads={args.threads}",
        f"--seed={args.seed}",
        f"--max-bs={args.max_bs}",
        f"--slot={args.slot}",
    ]
    return flags + (["--smoke"] if args.smoke else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    conversation.add_thinker_arguments(parser)
    parser.add_argument("--max-bs", type=int, default=8, help="the largest batch bucket")
    parser.add_argument(
        "--slot", type=int, default=256, help="positions per cache slot (spans: halves to 128)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny thinker, regions only")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help="inductor's cache to compile against (default: a new empty directory, cold)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:  # one bucket, one span: one graph
        args.max_bs, args.slot = 1, 128
    if args.child:
        return start_once(args)
    modes = [True] if args.smoke else [True, False]
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="omni-compile-start-") as tmp:
        for regions in modes:
            cache = (args.cache_dir or Path(tmp)) / ("regions" if regions else "whole")
            # warm: the same cache directory again (--smoke: cold only; the same code)
            for state in ("cold",) if args.smoke else ("cold", "warm"):
                key = f"{'regions' if regions else 'whole'}_{state}"
                seconds[key] = timed_start(args, regions, cache)
                print(f"{key}: ready in {seconds[key]:.1f} s", flush=True)
    width = "tiny widths" if args.smoke else "the release's width"
    if args.cache_dir is not None:
        print(f"\ncompiled against {args.cache_dir}: 'cold' is only as cold as it was")
    print(
        f"\nthinker, {args.layers} layer(s) at {width}, {args.dtype}, "
        f"{args.threads} thread(s), buckets up to {args.max_bs}, {args.slot} positions a slot"
    )
    print(f"{'':>8} {'cold s':>8} {'warm s':>8}")
    for mode in ("regions", "whole"):
        if f"{mode}_cold" in seconds:
            cold, warm = seconds[f"{mode}_cold"], seconds.get(f"{mode}_warm")
            print(f"{mode:>8} {cold:8.1f} {'-' if warm is None else f'{warm:.1f}':>8}")
    if "whole_cold" in seconds:
        print(
            f"whole / regions: cold {seconds['whole_cold'] / seconds['regions_cold']:.2f}x, "
            f"warm {seconds['whole_warm'] / seconds['regions_warm']:.2f}x"
        )
    print("BENCH_JSON " + json.dumps({"layers": args.layers, "dtype": args.dtype, **seconds}))
    return 0


if __name__ == "__main__":
    run_script(main)
