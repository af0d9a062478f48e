"""``Child.wait_ready`` when its process was stopped and its pipe closed while it waited.

A tensor-parallel rank that fails to start stops its siblings at once
(``Runtime._wait_ready``), and each sibling is still waited for: its stop
reaps the process and closes the pipe it reports on, so the next look at
that pipe finds it closed. That must read as the process being gone (a
StartupError, which the runtime reports as "was stopped"), never as an
OSError that escapes the start (seen once in CI: "handle is closed").
"""

from __future__ import annotations

import multiprocessing
import time

import pytest

from omni_core.plan.model import ProcessPlan
from omni_core.runtime.launchers.local import LocalProcess
from omni_core.runtime.processes import Child, StartupError

pytestmark = pytest.mark.anyio


def _exit_at_once() -> None:
    pass


def _reaped_with_its_pipe_closed(log_path: str) -> LocalProcess:
    """A real child that exited, joined the way ``Child.stop`` joins it (pipe closed)."""
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe(duplex=False)
    process = context.Process(target=_exit_at_once)
    process.start()
    child_end.close()
    handle = LocalProcess("rank0", log_path)
    handle.proc, handle.conn = process, parent_end
    handle.join(30)
    assert parent_end.closed and not handle.is_alive()
    return handle


async def test_a_child_stopped_while_waited_for_is_reported_gone_not_an_oserror(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text("loading shard 0\n")
    child = Child(
        plan=ProcessPlan(name="rank0", logical="rank0", stages=("split",), gpu=None),
        log_path=str(log),
        proc=_reaped_with_its_pipe_closed(str(log)),
    )
    child.started_at = time.monotonic()
    with pytest.raises(StartupError) as caught:
        await child.wait_ready(30)
    message = caught.value.render()
    assert "process rank0 " in message and "while starting" in message
    assert "loading shard 0" in message  # its log's last lines, as for any death
