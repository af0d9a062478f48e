"""The CPU core budget (omni_core/plan/threads.py): decoders first, helpers what is left."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from omni_core.plan.model import ProcessPlan
from omni_core.plan.render import render_plan
from omni_core.plan.threads import apply_cpu_threads, plan_cpu_threads


def _processes(*names: str) -> list[ProcessPlan]:
    return [ProcessPlan(name=n, logical=n, stages=(n,), gpu=None) for n in names]


def _threads(processes: list[ProcessPlan]) -> dict[str, int | None]:
    return {p.name: p.cpu_threads for p in processes}


def test_decoders_share_the_cores_and_helpers_get_the_rest():
    procs = _processes("pre", "thinker", "talker", "code2wav")
    plan_cpu_threads(procs, {"thinker", "talker"}, None, cores=16, environ={})
    assert _threads(procs) == {"pre": 1, "thinker": 8, "talker": 8, "code2wav": 1}
    procs = _processes("pre", "thinker", "code2wav")
    plan_cpu_threads(procs, {"thinker"}, None, cores=16, environ={})
    assert _threads(procs) == {"pre": 1, "thinker": 16, "code2wav": 1}
    assert procs[1].env["OMP_NUM_THREADS"] == str(procs[1].cpu_threads)
    assert procs[1].threads_source == "decoder share of 16 cores"


def test_a_lone_decoder_takes_every_core_and_helpers_at_least_one():
    procs = _processes("pipeline", "codec")
    plan_cpu_threads(procs, {"pipeline"}, None, cores=2, environ={})
    assert _threads(procs) == {"pipeline": 2, "codec": 1}
    procs = _processes("a", "b", "c")
    plan_cpu_threads(procs, set(), None, cores=7, environ={})
    assert _threads(procs) == {"a": 2, "b": 2, "c": 2}  # no decoder: an even share


def test_runtime_setting_then_stage_env_then_user_environment_win():
    procs = _processes("pipeline", "codec")
    procs[1].env["OMP_NUM_THREADS"] = "3"
    plan_cpu_threads(procs, {"pipeline"}, 5, cores=2, environ={})
    assert _threads(procs) == {"pipeline": 5, "codec": 3}
    assert [p.threads_source for p in procs] == ["runtime.cpu_threads", "stage env OMP_NUM_THREADS"]
    procs = _processes("pipeline")
    plan_cpu_threads(procs, {"pipeline"}, None, cores=8, environ={"OMP_NUM_THREADS": "4,2"})
    assert procs[0].cpu_threads == 4 and procs[0].threads_source == "environment OMP_NUM_THREADS"


def test_omni_plan_prints_each_process_threads(plugins, configure, monkeypatch):
    from omni_core.plan import plan_deployment
    from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    config = configure(Qwen3TTSPipeline, {"vocoder": {"process": "codec"}})
    plan = plan_deployment(config, plugins=plugins)
    out = io.StringIO()
    render_plan(plan, out)
    text = out.getvalue()
    assert "threads" in text and "cpu threads: decoder share of" in text
    assert "helper share of" in text and "codec" in text.split("cpu threads:")[1]
    assert "idle OpenMP threads spin 1000 turns (GOMP_SPINCOUNT)" in text  # 2 + 1 on 2 cores
    listed = json.loads(json.dumps(plan.to_dict()))
    by_name = {p["name"]: p for p in listed["processes"]}
    assert by_name["codec"]["cpu_threads"] == 1


# one thread is the case a default would not pass on these 2-core machines; 2 is test-all's
@pytest.mark.parametrize("threads", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_the_child_applies_the_budget_to_torch(threads):
    """In a fresh interpreter (inter-op threads can be set once per process)."""
    code = (
        "import torch\n"
        "from omni_core.plan.model import ProcessPlan\n"
        "from omni_core.plan.threads import apply_cpu_threads\n"
        f"p = ProcessPlan(name='x', logical='x', stages=(), gpu=None, cpu_threads={threads})\n"
        "apply_cpu_threads(p)\n"
        "print(torch.get_num_threads(), torch.get_num_interop_threads())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(threads), "1"]


def test_nothing_is_applied_without_a_number():
    import torch

    before = torch.get_num_threads()
    apply_cpu_threads(ProcessPlan(name="x", logical="x", stages=(), gpu=None))
    assert torch.get_num_threads() == before


def test_processes_that_share_the_cores_spin_briefly_between_ops():
    procs = _processes("pipeline", "codec")  # 2 + 1 threads on 2 cores
    plan_cpu_threads(procs, {"pipeline"}, None, cores=2, environ={})
    assert [p.env.get("GOMP_SPINCOUNT") for p in procs] == ["1000", "1000"]
    procs = _processes("pipeline")  # the cores to itself: OpenMP's own spin
    plan_cpu_threads(procs, {"pipeline"}, None, cores=2, environ={})
    assert "GOMP_SPINCOUNT" not in procs[0].env
    procs = _processes("pipeline", "codec")  # the user's setting wins
    procs[1].env["GOMP_SPINCOUNT"] = "50"
    plan_cpu_threads(procs, {"pipeline"}, None, cores=2, environ={"GOMP_SPINCOUNT": "7"})
    assert "GOMP_SPINCOUNT" not in procs[0].env and procs[1].env["GOMP_SPINCOUNT"] == "50"
