"""Start-up time of the core: ``omni plugins list`` and ``import omni_core``.

The core promises to answer planning and listing commands in a fraction of a
second because it imports no ML framework. This script measures that promise
in fresh interpreters (wall time, median of N runs) and says whether torch got
imported. It prints figures; it is not a test, because timings depend on the
machine.

    .venv/bin/python benchmarks/bench_startup.py [--runs N] [--target SECONDS]

To find where time goes: ``python -X importtime -m omni_core plugins list``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROBE = (
    "import sys, omni_core\n"
    "from omni_core.plugins import get_plugins\n"
    "plugins = get_plugins()\n"
    "plugins.listing()\n"
    "for name in plugins.pipelines(): plugins.pipeline(name)()\n"
    "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
)


def omni_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m omni_core``."""
    script = Path(sys.executable).with_name("omni")
    return [str(script)] if script.exists() else [sys.executable, "-m", "omni_core"]


def wall_times(argv: list[str], runs: int) -> list[float]:
    """Seconds per run of ``argv`` in a fresh process (one warm-up run discarded)."""
    env = {k: v for k, v in os.environ.items() if k != "OMNI_PLUGINS"}
    times = []
    for index in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        if index:  # the first run fills the OS file cache
            times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs per command")
    parser.add_argument("--target", type=float, default=0.3, help="seconds (median)")
    args = parser.parse_args()

    commands = {
        "python -c pass (interpreter floor)": [sys.executable, "-c", "pass"],
        'python -c "import omni_core"': [sys.executable, "-c", "import omni_core"],
        "omni plugins list": [*omni_command(), "plugins", "list"],
        "omni plugins list --json": [*omni_command(), "plugins", "list", "--json"],
    }
    print(f"python {sys.version.split()[0]} on {os.cpu_count()} CPUs; {args.runs} runs each")
    print(f"{'command':<38} {'median':>8} {'min':>8} {'max':>8}  target {args.target:.2f}s")
    over = False
    for label, argv in commands.items():
        times = wall_times(argv, args.runs)
        median = statistics.median(times)
        floor = label.startswith("python -c pass")
        verdict = "" if floor else ("ok" if median < args.target else "SLOW")
        over |= verdict == "SLOW"
        print(f"{label:<38} {median:8.3f} {min(times):8.3f} {max(times):8.3f}  {verdict}")

    heavy = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True
    ).stdout.strip()
    print(f"ML modules imported after listing and building every pipeline: {heavy}")
    return 1 if over or heavy != "[]" else 0


if __name__ == "__main__":
    sys.exit(main())
