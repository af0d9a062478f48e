"""The benchmarks' server starts hold SIGTERM back, so a stop never orphans a server.

``soak.Server.start`` forks ``omni serve`` inside ``signals_held``: a SIGTERM that
arrives there is delivered once the child is named (``Server.proc``), so the stop
that follows reaches it, while the child itself hears SIGTERM as usual.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _soak():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("soak_under_test", BENCHMARKS / "soak.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_sigterm_inside_the_block_is_delivered_after_it():
    soak = _soak()
    heard: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    try:
        with soak.signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            assert heard == []  # held back
        assert heard == [signal.SIGTERM]  # raised again when the block ends
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_server_started_inside_the_block_hears_sigterm():
    soak = _soak()
    with soak.signals_held():
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(30)"],
            preexec_fn=soak._die_with_parent,
        )
    try:
        status = Path(f"/proc/{child.pid}/status").read_text()
        blocked = int(
            next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16
        )
        assert not blocked & (1 << (signal.SIGTERM - 1))
        assert not blocked & (1 << (signal.SIGINT - 1))
        child.terminate()
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
