"""The runtime directory: private, ours, and never reached through a link."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_core.errors import ConfigError
from omni_core.plan.endpoints import default_base_path
from omni_core.runtime import rundir

ROOT = os.geteuid() == 0
LAUNCH = [sys.executable, str(Path(__file__).parents[1] / "serve" / "omni_launch.py")]


def test_a_fresh_directory_is_private_and_records_its_owner(short_tmp):
    base, path = short_tmp / "base", short_tmp / "base" / "dep"
    rundir.prepare(str(base), str(path))
    for made in (base, path):
        assert (made.stat().st_mode & 0o777) == 0o700
    owner = path / "owner.pid"
    assert owner.read_text() == str(os.getpid()) and (owner.stat().st_mode & 0o777) == 0o600


def test_a_stale_directory_of_ours_is_replaced(short_tmp):
    path = short_tmp / "dep"
    path.mkdir(mode=0o700)
    (path / "owner.pid").write_text("999999999")  # no such process
    (path / "old.sock").write_text("")
    rundir.prepare(str(short_tmp), str(path))
    assert sorted(os.listdir(path)) == ["owner.pid"]  # the logs have a directory of their own


def test_a_live_runtimes_directory_is_refused(short_tmp):
    path = short_tmp / "dep"
    path.mkdir(mode=0o700)
    (path / "owner.pid").write_text(str(os.getppid()))  # alive: our parent
    with pytest.raises(ConfigError, match=f"another omni runtime \\(pid {os.getppid()}\\)"):
        rundir.prepare(str(short_tmp), str(path))
    assert (path / "owner.pid").exists()


@pytest.mark.parametrize("where", ["base", "deployment"])
def test_a_planted_symlink_is_refused_and_nothing_is_written_through_it(short_tmp, where):
    target = short_tmp / "target"
    target.mkdir(mode=0o700)
    base = short_tmp / "base"
    if where == "base":
        base.symlink_to(target)
    else:
        base.mkdir(mode=0o700)
        (base / "dep").symlink_to(target)
    with pytest.raises(ConfigError, match="is a symbolic link") as refused:
        rundir.prepare(str(base), str(base / "dep"))
    assert "omni never follows links" in refused.value.message
    assert "rm -r" in refused.value.hint
    assert os.listdir(target) == []
    assert (target.stat().st_mode & 0o777) == 0o700  # not chmodded either


def test_a_directory_others_can_enter_is_refused_with_the_chmod(short_tmp):
    base = short_tmp / "base"
    base.mkdir(mode=0o700)
    base.chmod(0o755)
    with pytest.raises(ConfigError, match="has mode 0755") as refused:
        rundir.prepare(str(base), str(base / "dep"))
    assert f"chmod 700 {base}" in refused.value.hint
    assert not (base / "dep").exists()


@pytest.mark.skipif(not ROOT, reason="needs root to give a directory to another user")
def test_a_directory_of_another_user_is_refused(short_tmp):
    base = short_tmp / "base"
    base.mkdir(mode=0o700)
    os.chown(base, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to uid 65534, not to you"):
        rundir.prepare(str(base), str(base / "dep"))
    assert os.listdir(base) == []


def test_the_default_base_is_the_users_own(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert default_base_path() == f"{tmp_path}/omni"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    assert default_base_path() == f"{tmp_path}/omni-{os.geteuid()}"


def test_omni_serve_refuses_a_planted_link_with_exit_2(short_tmp):
    target = short_tmp / "target"
    target.mkdir(mode=0o700)
    base = short_tmp / "base"
    base.symlink_to(target)
    done = subprocess.run(
        [*LAUNCH, "serve", "--pipeline", "t-speech", "--port", "0", "--endpoints.base_path", base],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"the runtime base directory (endpoints.base_path) {base} is a symbolic link" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr and "loading" not in done.stderr
    assert os.listdir(target) == []
