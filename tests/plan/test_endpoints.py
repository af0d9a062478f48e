"""Runtime directory and Unix-socket endpoints: planned, never created."""

from __future__ import annotations

import os

import pytest

from omni_core.errors import ConfigError
from omni_core.plan import plan_deployment
from omni_core.plan.endpoints import SOCKET_PATH_MAX
from omni_qwen3_omni.pipeline import Qwen3OmniSpeechPipeline
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline


def test_endpoints_per_process_and_cross_process_stage(plugins):
    base = f"/tmp/omni-plan-test-{os.getpid()}"  # short: pytest's tmp_path is too long
    plan = plan_deployment(Qwen3OmniSpeechPipeline(endpoints={"base_path": base}), plugins=plugins)
    ep = plan.endpoints
    assert ep.runtime_dir == f"{base}/{ep.deployment_id}"
    assert ep.deployment_id.startswith("qwen3-omni-")
    assert ep.to_dict()["mode"] == "0700"
    assert set(ep.processes) == {p.name for p in plan.processes}
    assert plan.process("thinker").endpoint == f"{ep.runtime_dir}/p-thinker.sock"
    # every stage of the default deployment has a process of its own
    assert set(ep.stages) == set(Qwen3OmniSpeechPipeline().stage_names)
    assert ep.coordinator == f"{ep.runtime_dir}/c-coordinator.sock"
    assert not os.path.exists(base)  # planning creates nothing


def test_in_process_edges_need_no_stage_endpoint(plugins):
    plan = plan_deployment(Qwen3TTSPipeline(), plugins=plugins)
    assert list(plan.endpoints.stages) == ["preprocessing"]  # the entry stage only
    assert plan.stage("vocoder").endpoint is None


def test_deployment_id_is_stable_and_distinct(plugins):
    first = plan_deployment(Qwen3TTSPipeline(), plugins=plugins).endpoints.deployment_id
    again = plan_deployment(Qwen3TTSPipeline(), plugins=plugins).endpoints.deployment_id
    other = plan_deployment(Qwen3TTSPipeline(model_path="/models/tts"), plugins=plugins)
    assert first == again
    assert other.endpoints.deployment_id != first


def test_long_base_path_is_refused_with_the_fix(plugins):
    base = "/tmp/" + "x" * 60
    with pytest.raises(ConfigError) as info:
        plan_deployment(Qwen3OmniSpeechPipeline(endpoints={"base_path": base}), plugins=plugins)
    assert f"over the Unix socket limit of {SOCKET_PATH_MAX} bytes" in info.value.message
    assert "shorten endpoints.base_path (65 bytes now) by at least" in info.value.hint


def test_relative_base_path_is_refused(plugins):
    with pytest.raises(ConfigError, match="is not an absolute path"):
        plan_deployment(Qwen3TTSPipeline(endpoints={"base_path": "run"}), plugins=plugins)


def test_odd_process_names_become_safe_file_names(plugins, configure):
    config = configure(
        Qwen3TTSPipeline,
        {n: {"process": "a/b c"} for n in ("preprocessing", "tts_engine", "vocoder")},
    )
    plan = plan_deployment(config, plugins=plugins)
    assert plan.endpoints.processes["a/b c"].endswith("/p-a_b_c.sock")
