"""Checks every plan passes, whichever policy made it."""

from __future__ import annotations

import json
import os

import pytest

from omni_core.errors import ConfigError
from omni_core.plan import GpuInventory, plan_deployment
from omni_core.schema.deployment import RuntimeConfig
from omni_qwen3_omni.pipeline import Qwen3OmniSpeechPipeline
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

GiB = 1024**3


def test_gpu_beyond_inventory_names_ids_and_inventory(plugins, h100):
    with pytest.raises(ConfigError) as info:
        plan_deployment(Qwen3OmniSpeechPipeline(), h100, plugins=plugins)
    message = info.value.message
    assert "GPU 1 (asked for by stage talker_ar) is beyond the inventory" in message
    assert "1 GPU (id 0, 80GiB each; from config)" in message
    assert "--gpus 2" in info.value.hint
    assert "--talker_ar.gpu 0" in info.value.hint


def test_gpu_ids_from_cluster_config(plugins):
    config = Qwen3OmniSpeechPipeline(cluster={"gpus": 1})
    with pytest.raises(ConfigError, match="beyond the inventory: 1 GPU"):
        plan_deployment(config, plugins=plugins)


def test_unknown_inventory_does_not_check_ids(plugins):
    plan = plan_deployment(Qwen3OmniSpeechPipeline(), plugins=plugins)
    assert plan.inventory.count is None
    assert any("GPU ids were not checked" in note for note in plan.notes)


def test_process_may_not_span_gpus(plugins, h100x2, configure):
    config = configure(Qwen3TTSPipeline, {"vocoder": {"gpu": 1}})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, h100x2, plugins=plugins)
    assert "process 'pipeline' spans GPUs [0, 1] (GPU 0: tts_engine; GPU 1: vocoder)" in (
        info.value.message
    )


def test_several_processes_with_undeclared_engines_on_one_gpu(plugins, h100x2, configure):
    config = configure(Qwen3OmniSpeechPipeline, {"talker_ar": {"gpu": 0}})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, h100x2, plugins=plugins)
    assert "GPU 0: processes talker_ar, thinker each run an engine stage" in info.value.message
    assert "declare gpu_memory_fraction (or total_reserve_bytes) for talker_ar, thinker" in (
        info.value.hint
    )


def test_one_engine_declaring_its_share_is_enough(plugins, h100x2, configure):
    config = configure(
        Qwen3OmniSpeechPipeline, {"talker_ar": {"gpu": 0, "gpu_memory_fraction": 0.1}}
    )
    plan = plan_deployment(config, h100x2, plugins=plugins)
    assert plan.gpus[0].undeclared_stages == ["audio_encoder", "image_encoder", "thinker"]


def test_memory_limit(plugins, h100, configure):
    config = configure(
        Qwen3TTSPipeline,
        {"tts_engine": {"gpu_memory_fraction": 0.8}, "vocoder": {"gpu_memory_fraction": 0.15}},
    )
    assert plan_deployment(config, h100, plugins=plugins).gpus[0].gpu_memory_fraction_sum == 0.95
    limited = config.model_copy(
        update={"placement": config.placement.model_copy(update={"memory_limit": 0.9})}
    )
    with pytest.raises(ConfigError, match=r"sum to 0\.95, over the limit 0\.9 \(tts_engine 0\.8"):
        plan_deployment(limited, h100, plugins=plugins)


def test_reserved_bytes_count_against_known_memory(plugins, configure):
    config = configure(
        Qwen3TTSPipeline,
        {"tts_engine": {"total_reserve_bytes": 70 * GiB}, "vocoder": {"gpu_memory_fraction": 0.2}},
    )
    small = GpuInventory.uniform(1, 80 * GiB)
    with pytest.raises(
        ConfigError, match=r"GPU 0: memory shares sum to 1\.07, over the limit 1 \(tts_engine 70GiB"
    ):
        plan_deployment(config, small, plugins=plugins)
    plan = plan_deployment(config, GpuInventory.uniform(1, 141 * GiB), plugins=plugins)
    assert plan.gpus[0].total_reserve_bytes_sum == 70 * GiB
    unknown_memory = plan_deployment(config, GpuInventory.uniform(1), plugins=plugins)
    assert any("cannot be checked against its memory" in n for n in unknown_memory.notes)


def test_conflicting_env_defaults_in_one_process(plugins, configure):
    config = configure(
        Qwen3TTSPipeline,
        {
            "tts_engine": {"env": {"OMP_NUM_THREADS": "4"}},
            "vocoder": {"env": {"OMP_NUM_THREADS": "1"}},
        },
    )
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, plugins=plugins)
    assert (
        "process 'pipeline': stages 'tts_engine' and 'vocoder' set env default OMP_NUM_THREADS "
        "to different values ('4', '1')"
    ) in info.value.message


def test_agreeing_env_defaults_merge(plugins, configure):
    config = configure(
        Qwen3TTSPipeline,
        {"tts_engine": {"env": {"A": "1", "B": "2"}}, "vocoder": {"env": {"A": "1"}}},
    )
    env = plan_deployment(config, plugins=plugins).process("pipeline").env
    assert {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"} == {"A": "1", "B": "2"}


def test_each_process_gets_its_share_of_the_cores_unless_told(plugins, configure, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    split = configure(Qwen3TTSPipeline, {"vocoder": {"process": "codec"}})
    shares = {
        p.name: p.env["OMP_NUM_THREADS"] for p in plan_deployment(split, plugins=plugins).processes
    }
    # the decoder's process has the cores; the codec's what is left, at least one
    assert shares == {"pipeline": str(cores), "codec": "1"}
    pinned = configure(
        Qwen3TTSPipeline,
        {"vocoder": {"process": "codec", "env": {"OMP_NUM_THREADS": "3"}}},
        runtime=RuntimeConfig(cpu_threads=5),
    )
    plan = plan_deployment(pinned, plugins=plugins)
    assert plan.process("pipeline").env["OMP_NUM_THREADS"] == "5"  # runtime.cpu_threads
    assert plan.process("codec").env["OMP_NUM_THREADS"] == "3"  # a stage's own env wins


def test_all_reasons_are_reported_together(plugins, h100, configure):
    config = configure(
        Qwen3OmniSpeechPipeline,
        {
            "thinker": {"env": {"X": "1"}, "process": "shared"},
            "code2wav": {"env": {"X": "2"}, "process": "shared"},
        },
    )
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, h100, plugins=plugins)
    assert info.value.message.startswith("cannot plan pipeline 'qwen3-omni'")
    assert "beyond the inventory" in info.value.message
    assert "set env default X" in info.value.message


def test_plan_is_json_and_deterministic(plugins, h100x2):
    first = json.dumps(plan_deployment(Qwen3OmniSpeechPipeline(), h100x2, plugins).to_dict())
    second = json.dumps(plan_deployment(Qwen3OmniSpeechPipeline(), h100x2, plugins).to_dict())
    assert first == second
    data = json.loads(first)
    for key in ("processes", "gpus", "weight_share", "mps", "endpoints", "policy"):
        assert key in data
    process = data["processes"][0]
    for key in ("name", "stages", "gpu", "replica", "tp_rank"):
        assert key in process
    assert set(data["gpus"]["0"]) >= {"stages", "gpu_memory_fraction_sum", "undeclared_stages"}


def test_unknown_policy_names_the_real_ones(plugins):
    from omni_core.errors import PluginError

    config = Qwen3TTSPipeline(placement={"policy": "autoo"})
    with pytest.raises(PluginError) as info:
        plan_deployment(config, plugins=plugins)
    assert "auto, colocate, cpu, declared" in info.value.hint
    assert "did you mean: auto" in info.value.hint
