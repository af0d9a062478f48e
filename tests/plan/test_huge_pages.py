"""Huge pages for CPU weights (omni_core/engine/huge_pages.py, omni_core/plan/pages.py)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from omni_core.engine import huge_pages
from omni_core.engine.huge_pages import VAR, ask_for_huge_pages, granted_bytes, host_mode
from omni_core.plan.model import ProcessPlan
from omni_core.plan.pages import describe, plan_huge_pages
from omni_core.plan.render import render_plan


def _processes() -> list[ProcessPlan]:
    return [
        ProcessPlan(name="talker", logical="talker", stages=("talker",), gpu=None),
        ProcessPlan(name="thinker", logical="thinker", stages=("thinker",), gpu=0),
    ]


def test_cpu_processes_ask_and_gpu_ones_are_left_alone():
    procs = _processes()
    plan_huge_pages(procs, environ={})
    assert procs[0].env[VAR] == "1" and VAR not in procs[1].env


def test_the_users_value_wins_zero_included():
    procs = _processes()
    plan_huge_pages(procs, environ={VAR: "0"})
    assert all(VAR not in p.env for p in procs)  # the child inherits the user's 0
    procs = _processes()
    procs[0].env[VAR] = "0"  # a stage's own env
    plan_huge_pages(procs, environ={})
    assert procs[0].env[VAR] == "0"
    assert describe(procs, mode="madvise") is None


def test_asking_sets_the_variable_once_and_says_whether_it_did():
    environ: dict[str, str] = {}
    assert ask_for_huge_pages(environ) and environ == {VAR: "1"}
    assert not ask_for_huge_pages(environ)
    environ = {VAR: "0"}
    assert not ask_for_huge_pages(environ) and environ == {VAR: "0"}


@pytest.mark.parametrize(
    ("text", "mode"),
    [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"), ("", None)],
)
def test_the_hosts_mode_is_the_bracketed_one(tmp_path, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    assert host_mode(path) == mode
    assert host_mode(tmp_path / "absent") is None


def test_the_plan_says_what_it_asked_and_whether_the_host_grants_it(monkeypatch):
    procs = _processes()
    plan_huge_pages(procs, environ={})
    line = describe(procs, mode="madvise")
    assert line is not None and f"({VAR}=1): talker;" in line and "grants them (madvise)" in line
    assert "no effect until enabled" in (describe(procs, mode="never") or "")
    absent = huge_pages.MODE_FILE.with_name("absent-file")
    monkeypatch.setattr(huge_pages, "MODE_FILE", absent)
    assert "does not say whether it grants them" in (describe(procs) or "")


def test_omni_plan_prints_the_line(plugins, configure, monkeypatch):
    from omni_core.plan import plan_deployment
    from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

    monkeypatch.delenv(VAR, raising=False)
    config = configure(Qwen3TTSPipeline, {}, placement={"policy": "cpu"})
    plan = plan_deployment(config, plugins=plugins)
    assert plan.processes and all(p.env.get(VAR) == "1" for p in plan.processes)
    out = io.StringIO()
    render_plan(plan, out)
    assert f"cpu memory: 2 MB pages for CPU tensors of 2 MB or more ({VAR}=1)" in out.getvalue()


@pytest.mark.skipif(
    host_mode() not in ("madvise", "always") or granted_bytes() is None,
    reason="this host grants no transparent huge pages, or has no /proc to count them",
)
def test_a_stage_process_set_up_as_the_fork_server_leaves_it_gets_huge_pages():
    """The fork server imports torch before any stage process sets its env; torch must not
    have decided by then (it reads the variable at the first CPU allocation)."""
    from omni_core.runtime.launchers.local import PRELOAD

    code = (
        "import importlib, os\n"
        f"for name in {list(PRELOAD)!r}: importlib.import_module(name)\n"
        f"os.environ[{VAR!r}] = '1'  # child_main, from the plan's env\n"
        "import torch\n"
        "from omni_core.engine.huge_pages import granted_bytes\n"
        "weights = torch.ones(64 << 20, dtype=torch.uint8)\n"
        "print(granted_bytes())\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != VAR}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert int(out.stdout.split()[-1]) >= 32 << 20


def test_a_reference_started_from_a_benchmark_gets_the_users_environment(monkeypatch):
    monkeypatch.setattr(huge_pages, "_set_here", False)
    monkeypatch.delenv(VAR, raising=False)
    assert ask_for_huge_pages()
    assert __import__("os").environ[VAR] == "1" and VAR not in huge_pages.user_environ()
    monkeypatch.setattr(huge_pages, "_set_here", False)
    monkeypatch.setenv(VAR, "1")  # the user's own
    assert not ask_for_huge_pages() and huge_pages.user_environ()[VAR] == "1"
