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


def test_a_transport_that_stays_in_one_process_is_refused_between_processes(plugins):
    from omni_core.plan.planner import Infeasible

    config = Qwen3OmniSpeechPipeline(runtime={"transport": "inproc"})
    with pytest.raises((ConfigError, Infeasible)) as refused:
        plan_deployment(config, plugins=plugins)
    message = str(refused.value)
    assert "transport 'inproc' carries messages within one process only" in message
    assert "thinker->talker_ar" in message and "the coordinator's links" in message


def test_an_edge_override_may_pick_a_transport_for_one_edge(plugins):
    config = Qwen3OmniSpeechPipeline(runtime={"edge_transports": {"thinker->decode": "socket"}})
    assert plan_deployment(config, plugins=plugins).endpoints.coordinator


def test_every_listening_address_is_checked_by_its_transport(plugins):
    from omni_core import hookimpl
    from omni_core.transport import AddressError, Transport

    class Picky(Transport):
        name = "picky"
        scopes = frozenset({"host"})

        def check_address(self, address: str) -> str:
            raise AddressError(f"picky: {address} is too plain", hint="use a fancier base path")

        def listen(self, address, *, secret):  # pragma: no cover - never reached
            raise AssertionError

        def connect(self, address, *, secret):  # pragma: no cover - never reached
            raise AssertionError

    class PickyPlugin:
        @hookimpl
        def omni_register_transports(self):
            return [Picky()]

    with plugins.registered(PickyPlugin(), name="picky-plugin"):
        config = Qwen3TTSPipeline(runtime={"transport": "picky"})
        with pytest.raises(ConfigError) as refused:
            plan_deployment(config, plugins=plugins)
    message = str(refused.value)
    assert "transport 'picky' cannot listen at unix:" in message
    assert "for process 'pipeline': picky:" in message and "use a fancier base path" in message
