"""Time from ``omni serve FILE`` to ``omni: ready``, and a restart, forked or spawned.

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
then one of its stage processes is SIGKILLed and the time until ``/health`` says
every process is healthy again is taken (the supervisor's restart, its
``runtime.restart_backoff`` wait included, set to 0 here so that the start is what
is timed), and it is stopped with SIGTERM. Printed: each method's medians and every
run, and the ratios spawn / forkserver.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from omni_core.harness import short_private_dir
from omni_core.sigterm import run_script

REPO = Path(__file__).resolve().parents[1]
METHODS = ("spawn", "forkserver")
READY = "omni: ready"


def time_to_ready_and_restart(config: Path, method: str, timeout: float) -> tuple[float, float]:
    """Seconds from launching ``omni serve config`` to its ready line, and from killing
    one stage process to every process healthy again."""
    # a private runtime base, removed after: not the user's default /tmp/omni-<uid>
    with short_private_dir() as base:
        return _time_to_ready_and_restart(config, method, timeout, base)


def _time_to_ready_and_restart(
    config: Path, method: str, timeout: float, base: Path
) -> tuple[float, float]:
    env = {**os.environ, "OMNI_START_METHOD": method}
    command = [
        sys.executable,
        "-m",
        "omni_core",
        "serve",
        str(config),
        "--port",
        "0",
        "--runtime.restart_backoff",
        "0",
        "--endpoints.base_path",
        str(base),
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:
            if "omni: serving" in line:
                url = line.split(" on ", 1)[1].split()[0]
            if READY in line:
                ready = time.monotonic() - started
                break
            if time.monotonic() - started > timeout:
                raise SystemExit(f"omni serve {config} ({method}) did not print {READY!r}")
        else:
            raise SystemExit(f"omni serve {config} ({method}) exited before {READY!r}")
        victim = stage_processes(proc.pid)[-1]
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        while not restarted(url):
            if time.monotonic() - killed > timeout:
                raise SystemExit(f"{config} ({method}): no restart within {timeout:g} s")
            time.sleep(0.05)
        return ready, time.monotonic() - killed
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stage_processes(serve_pid: int) -> list[int]:
    """The stage processes below ``serve_pid`` (children, or the fork server's), by pid."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                commands[int(entry)] = handle.read().decode(errors="replace")
        except OSError:
            continue
    below = {pid for pid, parent in parents.items() if parent == serve_pid}
    servers = {pid for pid in below if "multiprocessing.forkserver" in commands.get(pid, "")}
    below |= {pid for pid, parent in parents.items() if parent in servers}
    helpers = servers | {pid for pid in below if "resource_tracker" in commands.get(pid, "")}
    return sorted(below - helpers)


def restarted(url: str) -> bool:
    """Whether ``/health`` reports a restart and every process healthy."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
            health = json.load(reply)
    except OSError:  # a 503 while the process is down
        return False
    processes = health.get("processes", {}).values()
    return any(p.get("restarts") for p in processes) and all(
        p.get("state") == "healthy" for p in processes
    )


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
    restarts: dict[str, list[float]] = {method: [] for method in METHODS}
    for _ in range(args.rounds):
        for method in METHODS:
            ready, restart = time_to_ready_and_restart(args.config, method, args.timeout)
            seconds[method].append(ready)
            restarts[method].append(restart)
    print(f"omni serve {args.config.name}, {os.cpu_count()} cores:")
    for label, table in ((f"to {READY!r}", seconds), ("a killed process back", restarts)):
        print(f" {label}:")
        for method, runs in table.items():
            each = ", ".join(f"{s:.2f}" for s in runs)
            print(f"  {method:>10}: median {statistics.median(runs):.2f} s ({each})")
        ratio = statistics.median(table["spawn"]) / statistics.median(table["forkserver"])
        print(f"  ratio spawn / forkserver: {ratio:.2f}x")


if __name__ == "__main__":
    run_script(main)
