"""Wall time and peak memory of ``omni config resolve`` and ``omni config explain``.

The seed's example (``examples/qwen3_tts.toml``: mem_fraction_static 0.6 and
max_batch_size 16; flags ``--vocoder.factory.max_batch_size 32 --mem-fraction-static 0.7``).
The reference system takes about 7 s and 495 MiB for this because it imports
torch and every model; the target here is under 0.3 s and under 80 MiB.
Each command runs in a fresh process; peak memory is the child's max RSS.

    .venv/bin/python benchmarks/bench_config.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1] / "examples" / "qwen3_tts.toml"
FLAGS = ["--vocoder.factory.max_batch_size", "32", "--mem-fraction-static", "0.7"]


def omni() -> list[str]:
    script = Path(sys.executable).with_name("omni")
    return [str(script)] if script.exists() else [sys.executable, "-m", "omni_core"]


def measure(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and the child's peak RSS (KiB on Linux) for one fresh run."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(argv)}")
    return elapsed, usage.ru_maxrss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    commands = {
        "config resolve --show diff": [
            *omni(),
            "config",
            "resolve",
            str(DEPLOY),
            *FLAGS,
            "--show",
            "diff",
        ],
        "config explain": [
            *omni(),
            "config",
            "explain",
            str(DEPLOY),
            "tts_engine.engine.mem_fraction_static",
            *FLAGS,
        ],
    }
    print(f"{'command':<30} {'median s':>9} {'p90 s':>7} {'peak MiB':>9}  target: <0.3 s, <80 MiB")
    for label, argv in commands.items():
        measure(argv)  # warm the file cache
        runs = [measure(argv) for _ in range(args.runs)]
        times = sorted(t for t, _ in runs)
        peak = max(rss for _, rss in runs) / 1024
        median = statistics.median(times)
        p90 = (
            statistics.quantiles(times, n=10, method="inclusive")[-1] if len(times) > 1 else median
        )
        print(f"{label:<30} {median:>9.3f} {p90:>7.3f} {peak:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
