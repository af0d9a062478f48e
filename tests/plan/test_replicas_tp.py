"""Replicas (``<stage>@r<i>``, ``<process>@r<i>``), replica_devices, tensor parallelism."""

from __future__ import annotations

import pytest

from omni_core.errors import ConfigError
from omni_core.plan import plan_deployment
from omni_qwen3_omni.pipeline import Qwen3OmniSpeechPipeline
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

SHARES = {"tts_engine": {"gpu_memory_fraction": 0.35}, "vocoder": {"gpu_memory_fraction": 0.1}}
TWO_ON_GPU0 = {"pipeline": {"num_replicas": 2, "replica_devices": [0, 0]}}


def test_two_replicas_on_one_gpu_without_shares_are_refused(plugins, h100):
    config = Qwen3TTSPipeline(processes=TWO_ON_GPU0)
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, h100, plugins=plugins)
    message = info.value.message
    assert "GPU 0: processes pipeline@r0, pipeline@r1" in message
    assert "without a declared memory share (tts_engine@r0, tts_engine@r1)" in message
    assert "first come first served" in message
    assert "declare gpu_memory_fraction (or total_reserve_bytes) for tts_engine" in info.value.hint


def test_two_replicas_with_shares(plugins, h100, configure):
    plan = plan_deployment(
        configure(Qwen3TTSPipeline, SHARES, processes=TWO_ON_GPU0), h100, plugins
    )
    assert [p.name for p in plan.processes] == ["pipeline@r0", "pipeline@r1"]
    assert plan.process("pipeline@r1").stages == (
        "preprocessing@r1",
        "tts_engine@r1",
        "vocoder@r1",
    )
    assert [p.replica for p in plan.processes] == [0, 1]
    assert all(p.gpu == 0 and p.num_replicas == 2 for p in plan.processes)
    assert plan.replicas["tts_engine"] == ["tts_engine@r0", "tts_engine@r1"]
    assert plan.process_replicas == {"pipeline": ["pipeline@r0", "pipeline@r1"]}
    assert plan.to_dict()["gpus"]["0"]["gpu_memory_fraction_sum"] == 0.9
    assert plan.weight_share.mode == "off"
    assert plan.start_waves == [["pipeline@r0", "pipeline@r1"]]


def test_weight_share_on_makes_r0_the_leader(plugins, h100, configure):
    config = configure(Qwen3TTSPipeline, SHARES, processes=TWO_ON_GPU0, weight_share="on")
    plan = plan_deployment(config, h100, plugins=plugins)
    (group,) = plan.weight_share.groups
    assert (group.process, group.gpu, group.stage) == ("pipeline", 0, "tts_engine")
    assert group.leader == "pipeline@r0"
    assert group.followers == ["pipeline@r1"]
    assert plan.process("pipeline@r0").weight_share == "leader"
    assert plan.process("pipeline@r1").weight_share == "follower"
    assert plan.start_waves == [["pipeline@r0"], ["pipeline@r1"]]


def test_replicas_over_the_limit_are_refused(plugins, h100, configure):
    three = {"pipeline": {"num_replicas": 3, "replica_devices": [0, 0, 0]}}
    with pytest.raises(ConfigError, match=r"GPU 0: memory shares sum to 1\.35, over the limit 1"):
        plan_deployment(configure(Qwen3TTSPipeline, SHARES, processes=three), h100, plugins)


def test_replica_devices_spread_replicas(plugins, h100x2):
    config = Qwen3TTSPipeline(
        processes={"pipeline": {"num_replicas": 2, "replica_devices": [0, 1]}}
    )
    plan = plan_deployment(config, h100x2, plugins=plugins)
    assert [(p.name, p.gpu) for p in plan.processes] == [("pipeline@r0", 0), ("pipeline@r1", 1)]
    assert plan.stage("vocoder@r1").gpus == (1,)
    assert plan.stage("preprocessing@r1").gpus == ()


def test_replica_devices_length_must_be_replicas_times_tp(plugins, h100x2):
    config = Qwen3TTSPipeline(processes={"pipeline": {"num_replicas": 2, "replica_devices": [0]}})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, h100x2, plugins=plugins)
    assert "processes.pipeline.replica_devices lists 1 GPU id [0]" in info.value.message
    assert "num_replicas x tp_size = 2 x 1 = 2" in info.value.message


def test_cpu_only_process_takes_no_devices(plugins, h100x2):
    config = Qwen3OmniSpeechPipeline(
        processes={"decode": {"num_replicas": 2, "replica_devices": [0, 1]}}
    )
    with pytest.raises(ConfigError, match="process 'decode' runs no GPU stage"):
        plan_deployment(config, h100x2, plugins=plugins)


def test_cpu_only_process_replicates_without_devices(plugins, h100x2):
    config = Qwen3OmniSpeechPipeline(processes={"decode": {"num_replicas": 3}})
    plan = plan_deployment(config, h100x2, plugins=plugins)
    assert plan.process_replicas["decode"] == ["decode@r0", "decode@r1", "decode@r2"]
    assert all(plan.process(f"decode@r{i}").gpu is None for i in range(3))


def test_gpu_replicas_need_devices_under_declared(plugins, h100x2):
    config = Qwen3TTSPipeline(processes={"pipeline": {"num_replicas": 2}})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, h100x2, plugins=plugins)
    assert "process 'pipeline' has 2 replicas with GPU stages" in info.value.message
    assert "but no replica_devices" in info.value.message
    assert "replica_devices with 2 GPU ids (e.g. [0, 1])" in info.value.hint


def test_tensor_parallel_stage_gets_one_process_per_rank(plugins, h100x2, tp_pipeline):
    plan = plan_deployment(tp_pipeline(), h100x2, plugins=plugins)
    ranks = [(p.name, p.gpu, p.tp_rank, p.leader) for p in plan.processes if p.logical == "big"]
    assert ranks == [("big_tp0", 0, 0, True), ("big_tp1", 1, 1, False)]
    assert plan.stage("big").tp_processes == ("big_tp0", "big_tp1")
    assert plan.gpus[0].processes == ["big_tp0", "back"]
    assert plan.to_dict()["gpus"]["1"]["gpu_memory_fraction_sum"] == 0.5


def test_tensor_parallel_replicas(plugins, tp_pipeline):
    from omni_core.plan import GpuInventory

    config = tp_pipeline(processes={"big": {"num_replicas": 2, "replica_devices": [0, 1, 2, 3]}})
    plan = plan_deployment(config, GpuInventory.uniform(4, 80 * 1024**3), plugins=plugins)
    names = [(p.name, p.gpu) for p in plan.processes if p.logical == "big"]
    assert names == [("big@r0_tp0", 0), ("big@r0_tp1", 1), ("big@r1_tp0", 2), ("big@r1_tp1", 3)]


def test_tensor_parallel_stage_cannot_share_a_process(plugins, h100x2, tp_pipeline, configure):
    config = configure(tp_pipeline, {"back": {"process": "big"}})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, h100x2, plugins=plugins)
    assert "stage 'big' (tp_size 2) shares process 'big' with back" in info.value.message
    assert "move back to another process (--back.process back)" in info.value.hint


def test_two_tp_ranks_on_one_gpu_are_refused(plugins, h100x2, tp_pipeline):
    config = tp_pipeline(processes={"big": {"num_replicas": 1, "replica_devices": [1, 1]}})
    with pytest.raises(ConfigError, match="puts two tensor-parallel ranks on one GPU"):
        plan_deployment(config, h100x2, plugins=plugins)
