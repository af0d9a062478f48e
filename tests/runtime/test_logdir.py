"""The processes' log directory: where it is, how it is checked, what is kept."""

from __future__ import annotations

import os
from pathlib import Path

import omni_test_pipelines as tp
import pytest

from omni_core.config import load_deployment
from omni_core.errors import ConfigError
from omni_core.runtime import logdir
from omni_core.testing import plan_on_cpu


def test_the_default_is_under_the_user_s_state_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert logdir.log_base(None) == str(tmp_path / "omni" / "logs")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/not/used")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert logdir.log_base(None) == str(tmp_path / "home" / ".local" / "state" / "omni" / "logs")
    assert logdir.log_base("~/x") == str(tmp_path / "home" / "x")


def test_log_dir_is_a_setting_and_a_flag(plugins):
    with plugins.registered(tp, tp.HERE):
        by_flag = load_deployment(
            None, ["--log-dir", "/srv/logs"], pipeline="t-linear", plugins=plugins
        )
        by_path = load_deployment(
            None, ["--runtime.log_dir", "/srv/l2"], pipeline="t-linear", plugins=plugins
        )
        default = load_deployment(None, [], pipeline="t-linear", plugins=plugins)
    assert by_flag.config.runtime.log_dir == "/srv/logs"
    assert by_path.config.runtime.log_dir == "/srv/l2"
    assert default.config.runtime.log_dir is None


def load(flags, plugins):
    return load_deployment(None, flags, pipeline="t-linear", plugins=plugins)


def test_a_run_directory_is_private_and_the_oldest_runs_go(tmp_path):
    base = tmp_path / "state" / "logs"
    made = []
    for second in range(4):
        run = logdir.new_run_dir(str(base), "d-0123456789", now=1_700_000_000 + second)
        logdir.prepare(run, "d-0123456789", keep=2)
        made.append(run)
    again = logdir.new_run_dir(str(base), "d-0123456789", now=1_700_000_003)
    assert again == made[-1] + "-2"  # the same second twice: a second directory
    (base / "other-0123456789-20200101T000000").mkdir()  # another deployment's: untouched
    assert sorted(os.listdir(base)) == sorted(
        [Path(made[2]).name, Path(made[3]).name, "other-0123456789-20200101T000000"]
    )
    assert logdir.last_run(str(base), "d-0123456789") == made[-1]
    assert (base.stat().st_mode & 0o777) == 0o700
    assert (Path(made[-1]).stat().st_mode & 0o777) == 0o700
    assert logdir.last_run(str(base), "nothing-here") is None


def test_an_unsafe_log_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="is a symbolic link") as caught:
        logdir.prepare(str(link / "d-1-20200101T000000"), "d-1")
    assert "runtime.log_dir" in caught.value.render()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(ConfigError, match="has mode 0755"):
        logdir.prepare(str(shared / "d-1-20200101T000000"), "d-1")
    assert os.listdir(shared) == [] and os.listdir(real) == []


def test_a_runtime_keeps_its_logs_after_it_stops(plugins, short_tmp):
    logs = short_tmp / "logs"
    with plugins.registered(tp, tp.HERE):
        flags = ["--log-dir", str(logs)]
        planned = plan_on_cpu(plugins, short_tmp, pipeline="t-linear", flags=flags)
        planned.run({"trail": []})
    (run,) = logs.iterdir()
    assert run.name.startswith(planned.plan.endpoints.deployment_id + "-")
    names = sorted(os.listdir(run))
    assert names and all(n.endswith(".log") for n in names)
    assert not os.path.exists(planned.plan.endpoints.runtime_dir)
