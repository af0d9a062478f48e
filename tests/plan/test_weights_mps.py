"""Weight sharing groups and MPS decisions."""

from __future__ import annotations

import io
from typing import ClassVar

import pytest

from omni_core import EngineStageConfig, StageConfig
from omni_core.errors import ConfigError
from omni_core.plan import GpuInventory, plan_deployment
from omni_core.plan.render import render_plan
from omni_qwen3_omni.pipeline import Qwen3OmniSpeechPipeline
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

from .conftest import TpPipeline

GiB = 1024**3
SHARES = {"tts_engine": {"gpu_memory_fraction": 0.2}, "vocoder": {"gpu_memory_fraction": 0.05}}


def tts(configure, devices, **kw):
    processes = {"pipeline": {"num_replicas": len(devices), "replica_devices": devices}}
    return configure(Qwen3TTSPipeline, SHARES, processes=processes, **kw)


def test_weight_share_groups_per_gpu(plugins, h100x2, configure):
    plan = plan_deployment(tts(configure, [0, 1, 0, 1], weight_share="on"), h100x2, plugins)
    groups = [(g.gpu, g.leader, g.followers) for g in plan.weight_share.groups]
    assert groups == [(0, "pipeline@r0", ["pipeline@r2"]), (1, "pipeline@r1", ["pipeline@r3"])]
    assert plan.start_waves == [["pipeline@r0", "pipeline@r1"], ["pipeline@r2", "pipeline@r3"]]


def test_weight_share_without_a_shared_gpu_is_refused(plugins, h100x2, configure):
    with pytest.raises(ConfigError) as info:
        plan_deployment(tts(configure, [0, 1], weight_share="on"), h100x2, plugins)
    assert "no two replicas of one process share a GPU (pipeline: GPUs [0, 1])" in (
        info.value.message
    )
    assert "weight_share = off" in info.value.hint


def test_weight_share_without_replicas_is_refused(plugins):
    with pytest.raises(ConfigError, match=r"share a GPU \(no process has replicas\)"):
        plan_deployment(Qwen3TTSPipeline(weight_share="on"), plugins=plugins)


def test_weight_share_needs_exactly_one_engine(plugins, h100, configure):
    shares = {n: {"gpu_memory_fraction": 0.1} for n in ("image_encoder",)}
    config = configure(
        Qwen3OmniSpeechPipeline,
        shares,
        processes={"image_encoder": {"num_replicas": 2, "replica_devices": [0, 0]}},
        weight_share="on",
        cluster={"gpus": 2},
    )
    with pytest.raises(ConfigError, match="process 'image_encoder' has no engine stage"):
        plan_deployment(config, plugins=plugins)


class TpAndSharedPipeline(TpPipeline):
    """TpPipeline with ``back`` an engine stage, so its replicas can share weights."""

    pipeline_name: ClassVar[str] = "test-tp-shared"

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        stages = TpPipeline.default_stages()
        back = stages[-1]
        engine = EngineStageConfig(**{**back.model_dump(exclude_unset=True), "name": "back"})
        return [*stages[:-1], engine]


def test_weight_share_skips_tensor_parallel(plugins):
    # big (TP 2): both replicas put rank 0 on GPU 0 and rank 1 on GPU 1, which would be a
    # sharing group per GPU were it not tensor-parallel; back's replicas share GPU 0
    config = TpAndSharedPipeline(
        processes={
            "big": {"num_replicas": 2, "replica_devices": [0, 1, 0, 1]},
            "back": {"num_replicas": 2, "replica_devices": [0, 0]},
        },
        weight_share="on",
    )
    config = config.model_copy(
        update={
            "stages": [
                s.model_copy(update={"gpu_memory_fraction": 0.2}) if s.name == "big" else s
                for s in config.stages
            ]
        }
    )
    plan = plan_deployment(config, GpuInventory.uniform(2, 80 * GiB), plugins=plugins)
    note = (
        "process 'big' is tensor-parallel: its replicas load their own shards "
        "(weight sharing skipped)"
    )
    assert note in plan.notes
    assert note in plan.weight_share.notes
    groups = [(g.process, g.gpu, g.leader, g.followers) for g in plan.weight_share.groups]
    assert groups == [("back", 0, "back@r0", ["back@r1"])]
    big = [p for p in plan.processes if p.logical == "big"]
    assert sorted((p.replica, p.tp_rank, p.gpu) for p in big) == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 1, 1),
    ]
    assert {(p.weight_share, p.start_wave) for p in big} == {("none", 0)}


def test_mps_off_on_auto(plugins, h100x2, configure):
    def decisions(mode, inventory=h100x2):
        plan = plan_deployment(tts(configure, [0, 0, 1], mps=mode), inventory, plugins)
        return {g: (d.enabled, d.clients) for g, d in plan.mps.gpus.items()}, plan

    off, _ = decisions("off")
    assert off == {0: (False, ["pipeline@r0", "pipeline@r1"]), 1: (False, ["pipeline@r2"])}
    on, _ = decisions("on")
    assert on == {0: (True, ["pipeline@r0", "pipeline@r1"]), 1: (True, ["pipeline@r2"])}
    auto, plan = decisions("auto")
    assert auto == {0: (True, ["pipeline@r0", "pipeline@r1"]), 1: (False, ["pipeline@r2"])}
    assert "nothing to share" in plan.mps.gpus[1].reason
    assert plan.to_dict()["mps"]["gpus"]["0"]["enabled"] is True


def test_mps_on_without_the_control_binary_is_refused(plugins, configure):
    no_mps = GpuInventory.uniform(2, 80 * GiB, mps_available=False)
    with pytest.raises(ConfigError, match="mps = on, but nvidia-cuda-mps-control is not on PATH"):
        plan_deployment(tts(configure, [0, 0], mps="on"), no_mps, plugins)
    plan = plan_deployment(tts(configure, [0, 0], mps="auto"), no_mps, plugins)
    assert plan.mps.gpus[0].enabled is False
    assert "nvidia-cuda-mps-control is absent" in plan.mps.gpus[0].reason
    assert any("GPUs run without MPS" in n for n in plan.notes)


def test_mps_with_unknown_binary_is_left_to_the_runtime(plugins, configure):
    unknown = GpuInventory.uniform(1, 80 * GiB)
    plan = plan_deployment(tts(configure, [0, 0], mps="on"), unknown, plugins)
    assert plan.mps.gpus[0].enabled
    assert any("the runtime checks" in n for n in plan.notes)


def test_cpu_replicas_form_a_host_group_with_their_weights_counted_once(plugins):
    config = Qwen3TTSPipeline(
        model_path="Qwen/Qwen3-TTS-12Hz-0.6B-Base",
        placement={"policy": "cpu"},
        processes={"pipeline": {"num_replicas": 3}},
        weight_share="on",
    )
    plan = plan_deployment(config, plugins=plugins)
    (group,) = plan.weight_share.groups
    assert (group.gpu, group.leader, group.followers) == (
        None,
        "pipeline@r0",
        ["pipeline@r1", "pipeline@r2"],
    )
    # One copy: the process's stages' estimated weights (talker and codec), saved twice.
    copy = sum(e.weights_bytes for e in plan.estimates.values())
    assert copy > 0 and group.weights_bytes == copy
    assert group.saved_bytes == 2 * copy
    assert plan.to_dict()["weight_share"]["groups"][0]["saved_bytes"] == 2 * copy
    assert plan.start_waves == [["pipeline@r0"], ["pipeline@r1", "pipeline@r2"]]
    out = io.StringIO()
    render_plan(plan, out)
    text = out.getvalue()
    assert "weight sharing: pipeline on the host (tts_engine): pipeline@r0 leads, " in text
    assert "counted once" in text


def test_cpu_replicas_without_weight_sharing_plan_no_group(plugins):
    config = Qwen3TTSPipeline(
        placement={"policy": "cpu"}, processes={"pipeline": {"num_replicas": 2}}
    )
    plan = plan_deployment(config, plugins=plugins)
    assert plan.weight_share.groups == [] and plan.start_waves == [["pipeline@r0", "pipeline@r1"]]


def test_a_plugin_that_cannot_estimate_costs_the_count_not_the_plan(plugins, monkeypatch):
    import omni_core.plan.weights as weights
    from omni_core.errors import PluginError

    def broken(config, plugins):
        raise PluginError("estimating the memory failed")

    monkeypatch.setattr(weights, "collect_estimates", broken)
    config = Qwen3TTSPipeline(
        placement={"policy": "cpu"}, processes={"pipeline": {"num_replicas": 2}}, weight_share="on"
    )
    (group,) = plan_deployment(config, plugins=plugins).weight_share.groups
    assert (group.leader, group.weights_bytes, group.saved_bytes) == ("pipeline@r0", None, None)
