"""Where a test run keeps its temporary files: one directory per run, gone when it ends.

The root conftest makes it in the main process and hands it on as TMPDIR, so
a worker stopped before its fixtures ran (xdist gives up on one after 30 s)
leaves nothing outside it; ``short_private_dir`` keeps its directories under
``/tmp`` (Unix socket paths, Ray's among them, must stay short) and lists
each in the run's directory, whose owner removes what is listed at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from unittest import mock

import pytest

from omni_core.harness import RUN_LIST, RUN_OWNER, remove_stale_run_roots, short_private_dir

REPO = Path(__file__).resolve().parents[1]


def test_this_run_keeps_its_temporary_files_in_a_directory_of_its_own():
    root = os.environ["OMNI_TEST_RUN_ROOT"]
    assert os.path.basename(root).startswith("omni-run-") and os.path.isdir(root)
    assert tempfile.gettempdir() == root == os.environ["TMPDIR"]
    with short_private_dir() as path:
        assert path.parent == Path("/tmp")  # short, for socket paths
        listed = Path(root, RUN_LIST, path.name)
        assert listed.read_text() == str(path)  # for the run to remove, should this end early
    assert not path.exists() and not listed.exists()
    # pytest's own tmp_path directories stay where pytest keeps them
    assert not os.environ["PYTEST_DEBUG_TEMPROOT"].startswith(root)


@pytest.mark.skipif(not os.path.isdir("/tmp"), reason="the run's directory goes under /tmp")
def test_a_run_removes_its_directory_and_what_its_tests_left_in_it(tmp_path):
    """A run whose test leaves a file in the temporary directory and a short directory
    under /tmp (as a worker killed before its teardown does): after the run, none of
    them, nor the run's directory, is there."""
    test = tmp_path / "test_leaves.py"
    test.write_text(
        textwrap.dedent(
            """
            import os, tempfile

            from omni_core.harness import short_private_dir

            def test_leaves_a_file_and_a_short_dir():
                fd, path = tempfile.mkstemp(prefix="left-")
                os.close(fd)
                made = short_private_dir()
                short = made.__enter__()  # never left: as a process killed inside it
                print("LEFT", path, short, os.environ["OMNI_TEST_RUN_ROOT"])
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMNI_TEST_RUN_ROOT", "TMPDIR")}
    env.pop("PYTEST_DEBUG_TEMPROOT", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    # the repository's root conftest, loaded as a plugin: the file lies outside it
    argv = [sys.executable, "-m", "pytest", "-qs", "-p", "no:cacheprovider", "-p", "conftest"]
    done = subprocess.run(
        [*argv, str(test)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("LEFT"))
    _, left, short, root = line.split()
    assert left.startswith(root + "/") and Path(root).name.startswith("omni-run-")
    assert short.startswith("/tmp/omni-t")
    assert not Path(left).exists() and not Path(short).exists() and not Path(root).exists()


def _gone_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_a_killed_runs_directory_is_removed_by_the_next_run_with_what_it_listed(tmp_path):
    """The directory of a run whose main process was killed outright (no atexit), with
    the short directory it listed, goes; a live run's, and a fresh unowned one, stay."""
    parent = tmp_path
    dead = parent / "omni-run-dead"
    (dead / RUN_LIST).mkdir(parents=True)
    (dead / RUN_OWNER).write_text(str(_gone_pid()))
    short = parent / "omni-t-left"
    short.mkdir()
    (dead / RUN_LIST / short.name).write_text(str(short))
    live = parent / "omni-run-live"
    live.mkdir()
    (live / RUN_OWNER).write_text(str(os.getpid()))
    fresh, old = parent / "omni-run-fresh", parent / "omni-run-old"
    fresh.mkdir()
    old.mkdir()
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    other = parent / "not-a-run"
    other.mkdir()

    # the listed short directory is removed only where it lies under /tmp or TMPDIR
    with mock.patch.object(tempfile, "tempdir", str(parent)):
        removed = remove_stale_run_roots(str(parent))

    assert sorted(removed) == sorted([str(dead), str(old)])
    assert not dead.exists() and not short.exists() and not old.exists()
    assert live.is_dir() and fresh.is_dir() and other.is_dir()


def test_this_run_names_its_owner():
    root = Path(os.environ["OMNI_TEST_RUN_ROOT"])
    owner = int((root / RUN_OWNER).read_text())
    assert owner != os.getpid() or "PYTEST_XDIST_WORKER" not in os.environ
    os.kill(owner, 0)  # the main pytest process: alive while its tests run


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_killed_owner_not_yet_reaped_counts_as_gone(tmp_path):
    """A main process killed a moment ago is a zombie until its parent reaps it: signal 0
    still reaches it, yet its run has ended."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = tmp_path / "omni-run-zombie"
        run.mkdir()
        (run / RUN_OWNER).write_text(str(child.pid))
        assert remove_stale_run_roots(str(tmp_path)) == []
        child.kill()
        deadline = time.monotonic() + 10
        while "Z" not in Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2][:3]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert remove_stale_run_roots(str(tmp_path)) == [str(run)]
    finally:
        child.kill()
        child.wait()
