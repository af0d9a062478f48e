"""``omni_core.runtime.pids.running``: a zombie is not a live process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from omni_core.runtime.pids import running


def test_this_process_runs():
    assert running(os.getpid())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_dead_child_does_not_run_before_or_after_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60
    while running(child.pid) and time.monotonic() < deadline:  # exited, not yet reaped
        time.sleep(0.02)
    with open(f"/proc/{child.pid}/stat") as handle:
        assert handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    assert not running(child.pid)
    child.wait()
    assert not running(child.pid)
