"""Time from ``omni serve FILE`` to ``omni: ready``, stage processes forked or spawned.

Run: ``python benchmarks/bench_startup.py [--config examples/qwen3_omni_demo.toml]
[--rounds 3]`` (about a minute on two cores; ``--smoke``: the Qwen3-TTS demo, one
round, to check that the script runs).

Why: every stage process needs torch before it can build anything, 2-3 s of CPU
per process on a small machine when each imports it afresh (``spawn``). omni
starts them as forks of one server that imported it once (``forkserver``,
``omni_core/runtime/launchers/local.py``); ``OMNI_START_METHOD`` chooses. Each
round starts the deployment once per method, the methods taking turns so that
load that comes and goes falls on both; each start is a whole ``omni serve``
process, timed from its launch to the line it prints once every process is up,
then stopped with SIGTERM. Printed: each method's median and every start, and
the ratio spawn / forkserver.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = ("spawn", "forkserver")
READY = "omni: ready"


def time_to_ready(config: Path, method: str, timeout: float) -> float:
    """Seconds from launching ``omni serve config`` to its ready line."""
    env = {**os.environ, "OMNI_START_METHOD": method}
    command = [sys.executable, "-m", "omni_core", "serve", str(config), "--port", "0"]
    started = time.monotonic()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if READY in line:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                break
        raise SystemExit(f"omni serve {config} ({method}) did not print {READY!r}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        type=Path,
        default=REPO / "examples" / "qwen3_omni_demo.toml",
        help="the deploy file to serve (default: the seven-process Qwen3-Omni demo)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="starts per method")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for ready")
    parser.add_argument(
        "--smoke", action="store_true", help="the Qwen3-TTS demo, one round: checks the script"
    )
    args = parser.parse_args()
    if args.smoke:
        args.config, args.rounds = REPO / "examples" / "qwen3_tts_demo.toml", 1
    seconds: dict[str, list[float]] = {method: [] for method in METHODS}
    for _ in range(args.rounds):
        for method in METHODS:
            seconds[method].append(time_to_ready(args.config, method, args.timeout))
    print(f"omni serve {args.config.name} to {READY!r}, {os.cpu_count()} cores:")
    for method, runs in seconds.items():
        each = ", ".join(f"{s:.1f}" for s in runs)
        print(f"  {method:>10}: median {statistics.median(runs):.1f} s ({each})")
    ratio = statistics.median(seconds["spawn"]) / statistics.median(seconds["forkserver"])
    print(f"  ratio spawn / forkserver: {ratio:.2f}x")


if __name__ == "__main__":
    main()
