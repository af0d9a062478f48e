"""SIGTERM unwinds scripts and test runs like Ctrl-C (omni_core.sigterm).

Each case runs a real Python process and signals it as ``timeout`` or a
supervisor would; what it made must be gone afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from omni_core.sigterm import (
    EXIT_TERMINATED,
    run_child,
    signal_handlers_kept,
    unwind_on_sigterm,
)

SCRIPT = """
import atexit, pathlib, sys, time
from omni_core.sigterm import run_script

work = pathlib.Path(sys.argv[1])

def main():
    atexit.register(lambda: (work.parent / "atexit-ran").touch())
    try:
        # made inside the try: a signal that lands just after mkdir (still inside
        # pathlib's frame) must meet the cleanup; tests wait for "file"
        work.mkdir()
        (work / "file").touch()
        print("ready", flush=True)
        time.sleep(60)
    finally:
        time.sleep(float(sys.argv[2]))  # a cleanup that takes a while
        (work / "file").unlink(missing_ok=True)
        if work.exists():
            work.rmdir()
        (work.parent / "cleaned").touch()
    return 0

run_script(main)
"""


def _start(tmp_path: Path, source: str, *args: str, **popen) -> subprocess.Popen[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


def _start_parent_of_script(tmp_path: Path, parent: str) -> subprocess.Popen[str]:
    """``parent`` started with SCRIPT as its child, returned once the child is inside the
    try whose cleanup the tests check (its work's file exists)."""
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(SCRIPT))
    proc = _start(tmp_path, parent, str(child), str(tmp_path / "work"))
    deadline = time.monotonic() + 60
    while not (tmp_path / "work" / "file").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    return proc


def test_a_script_stopped_by_sigterm_removes_what_it_made_and_exits_143(tmp_path):
    proc = _start(tmp_path, SCRIPT, str(tmp_path / "work"), "0")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_TERMINATED == 143
    assert not (tmp_path / "work").exists()
    assert (tmp_path / "cleaned").exists() and (tmp_path / "atexit-ran").exists()
    assert "terminated (SIGTERM)" in err


def test_signals_that_follow_do_not_cut_the_cleanup_short(tmp_path):
    proc = _start(tmp_path, SCRIPT, str(tmp_path / "work"), "1.0")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # inside the one-second cleanup
    proc.send_signal(signal.SIGTERM)  # timeout's group signal, then the parent's own
    proc.send_signal(signal.SIGINT)  # pytest-xdist's worker interrupts itself after 5 s
    proc.communicate(timeout=60)
    assert proc.returncode == EXIT_TERMINATED
    assert (tmp_path / "cleaned").exists() and not (tmp_path / "work").exists()


def test_a_program_that_handles_sigterm_itself_keeps_its_handler():
    def own(signum, frame):  # pragma: no cover - never signalled
        pass

    with signal_handlers_kept():
        signal.signal(signal.SIGTERM, own)
        assert unwind_on_sigterm() is False
        assert signal.getsignal(signal.SIGTERM) is own


def test_off_the_main_thread_nothing_is_installed():
    said: list[bool] = []
    thread = threading.Thread(target=lambda: said.append(unwind_on_sigterm()))
    thread.start()
    thread.join()
    assert said == [False]


def test_signal_handlers_kept_puts_back_what_the_block_replaced():
    before = {n: signal.getsignal(n) for n in (signal.SIGTERM, signal.SIGINT)}
    with signal_handlers_kept():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as ray.init does, with a sys.exit
    assert {n: signal.getsignal(n) for n in before} == before


def test_run_child_gives_a_child_past_its_timeout_sigterm_and_time_to_clean_up(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_child([sys.executable, str(script), str(tmp_path / "work"), "0.5"], timeout=3)
    assert (tmp_path / "cleaned").exists() and not (tmp_path / "work").exists()
    assert "ready" in caught.value.stdout
    assert "terminated (SIGTERM)" in caught.value.stderr


def test_run_child_kills_a_child_that_ignores_sigterm_after_the_grace(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_child([sys.executable, str(script)], timeout=2, grace=0.5)
    assert "ready" in caught.value.stdout  # it was running, and run_child came back


def test_an_interrupted_parent_lets_its_child_clean_up_before_it_exits(tmp_path):
    parent = """
    import pathlib, sys
    from omni_core.sigterm import run_child, run_script

    def main():
        child = [sys.executable, sys.argv[1], sys.argv[2], "0.5"]
        print("ready", flush=True)
        run_child(child)
        return 0

    run_script(main)
    """
    proc = _start_parent_of_script(tmp_path, parent)
    proc.send_signal(signal.SIGTERM)  # the parent alone: it stops its child
    proc.communicate(timeout=60)
    assert proc.returncode == EXIT_TERMINATED
    assert (tmp_path / "cleaned").exists() and not (tmp_path / "work").exists()


def test_a_test_run_stopped_like_timeout_does_tears_its_fixtures_down(tmp_path):
    """``timeout`` signals the whole process group: pytest and its xdist workers."""
    (tmp_path / "conftest.py").write_text(
        "from omni_core.sigterm import unwind_on_sigterm\nunwind_on_sigterm()\n"
    )
    (tmp_path / "test_long.py").write_text(
        textwrap.dedent(
            """
            import pathlib, time
            import pytest

            HERE = pathlib.Path(__file__).parent

            @pytest.fixture
            def made(request):
                name = request.node.name
                (HERE / f"made-{name}").mkdir()
                yield
                (HERE / f"made-{name}").rmdir()
                (HERE / f"torn-down-{name}").touch()

            @pytest.mark.parametrize("n", [1, 2])
            def test_long(made, n):
                (HERE / f"running-{n}").touch()
                time.sleep(120)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
    proc = subprocess.Popen(
        [*argv, "--rootdir", str(tmp_path), str(tmp_path / "test_long.py")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("running-*"))) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert sorted(p.name for p in tmp_path.glob("torn-down-*")) == [
        "torn-down-test_long[1]",
        "torn-down-test_long[2]",
    ], out
    assert not list(tmp_path.glob("made-*")), out


def test_serving_in_process_leaves_the_hosts_handlers_as_they_were():
    """``omni serve``'s signal watch (asyncio's) would leave SIG_DFL behind on exit."""
    import anyio

    from omni_core.serve.launch import run_until_signal

    before = {n: signal.getsignal(n) for n in (signal.SIGTERM, signal.SIGINT)}

    async def work(signals):
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]  # watched now
        return "done"

    result, signals = anyio.run(run_until_signal, work)
    assert result == "done" and signals.count == 0
    assert {n: signal.getsignal(n) for n in before} == before


def test_forwarding_reaches_a_child_that_leads_a_process_group_of_its_own(tmp_path):
    """As an xdist worker that started a Ray head node does: a group signal misses it."""
    parent = """
    import subprocess, sys
    from omni_core.sigterm import children, run_script, unwind_on_sigterm

    unwind_on_sigterm(forward_to_children=True)

    def main():
        child = subprocess.Popen(
            [sys.executable, sys.argv[1], sys.argv[2], "0"], start_new_session=True
        )
        assert child.pid in children()
        print("ready", flush=True)
        child.wait()
        return 0

    run_script(main)
    """
    proc = _start_parent_of_script(tmp_path, parent)
    proc.send_signal(signal.SIGTERM)  # the parent alone; the child is in another group
    proc.communicate(timeout=60)
    assert proc.returncode == EXIT_TERMINATED
    deadline = time.monotonic() + 60
    while not (tmp_path / "cleaned").exists():  # the child heard it and cleaned up
        assert time.monotonic() < deadline, "the child never got the forwarded SIGTERM"
        time.sleep(0.02)
    assert not (tmp_path / "work").exists()
