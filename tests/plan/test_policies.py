"""The built-in placement policies: declared, colocate, cpu, auto."""

from __future__ import annotations

import re

import pytest

from omni_core.errors import ConfigError
from omni_core.plan import GpuInventory, plan_deployment
from omni_core.plan.policies import BUILTIN_POLICIES
from omni_qwen3_omni.pipeline import (
    Qwen3OmniColocatedPipeline,
    Qwen3OmniSpeechPipeline,
    Qwen3OmniTextPipeline,
)
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

GiB = 1024**3


def test_builtins_are_registered_through_the_hook(plugins):
    names = [cls.name for cls in BUILTIN_POLICIES]
    assert names == ["declared", "colocate", "cpu", "auto"]
    for name in names:
        assert plugins.registries.policies[name].plugin == "omni_core.builtins.placement"


def test_cpu_puts_everything_on_the_host(plugins):
    plan = plan_deployment(Qwen3OmniSpeechPipeline(placement={"policy": "cpu"}), plugins=plugins)
    assert plan.gpus == {}
    assert all(p.gpu is None for p in plan.processes)
    assert len(plan.processes) == 7
    assert any("run on the host" in note for note in plan.notes)


def test_cpu_is_suggested_where_there_are_no_gpus(plugins):
    with pytest.raises(ConfigError) as info:
        plan_deployment(Qwen3TTSPipeline(), GpuInventory.uniform(0), plugins=plugins)
    assert "beyond the inventory: no GPUs" in info.value.message
    assert "placement policy cpu would plan this deployment" in info.value.hint


def test_colocate_moves_every_gpu_stage_to_one_gpu(plugins, h100x2, configure):
    # shares that hold each stage's weights (the thinker's 57 GiB of bf16 weights need 0.71)
    shares = {
        name: {"gpu_memory_fraction": share}
        for name, share in {
            "image_encoder": 0.02, "audio_encoder": 0.02, "thinker": 0.75,
            "talker_ar": 0.09, "code2wav": 0.01,
        }.items()
    }  # fmt: skip
    config = configure(Qwen3OmniSpeechPipeline, shares, placement={"policy": "colocate"})
    plan = plan_deployment(config, h100x2, plugins=plugins)
    assert list(plan.gpus) == [0]
    assert plan.process("talker_ar").gpu == 0


def test_colocate_refuses_tensor_parallel(plugins, h100x2, tp_pipeline):
    config = tp_pipeline(placement={"policy": "colocate"})
    with pytest.raises(ConfigError, match="tp_size 2 needs 2 GPUs, but colocate puts"):
        plan_deployment(config, h100x2, plugins=plugins)


def test_colocate_names_a_non_engine_process_without_share(plugins, configure):
    shares = {n: {"gpu_memory_fraction": 0.1} for n in ("thinker", "talker_ar", "audio_encoder")}
    config = configure(Qwen3OmniColocatedPipeline, shares)
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, plugins=plugins)
    assert "1 problem" in info.value.message
    assert "stage 'image_encoder'" in info.value.message


def test_auto_fits_the_omni_pipeline_on_two_gpus(plugins, h100x2):
    plan = plan_deployment(Qwen3OmniSpeechPipeline(placement={"policy": "auto"}), h100x2, plugins)
    placed = {p.name: p.gpu for p in plan.processes}
    # the thinker fills most of one GPU; everything else goes to the other
    assert placed["thinker"] == 0
    assert {placed[n] for n in ("talker_ar", "code2wav", "audio_encoder", "image_encoder")} == {1}
    thinker = plan.stage("thinker")
    assert thinker.share_source == "estimate"
    assert 0.5 < thinker.gpu_memory_fraction < 1
    assert plan.estimates["thinker"].weights_bytes > 50 * GiB
    for usage in plan.gpus.values():
        assert usage.gpu_memory_fraction_sum <= 1.0
        assert usage.undeclared_stages == []


def test_auto_does_not_fit_on_one_small_gpu(plugins):
    small = GpuInventory.uniform(2, 24 * GiB)
    with pytest.raises(ConfigError) as info:
        plan_deployment(Qwen3OmniSpeechPipeline(placement={"policy": "auto"}), small, plugins)
    message = info.value.message
    assert "0/2 GPUs fit process 'thinker' (stage thinker): GPU 0 has 1.00 (24GiB) left, needs" in (
        message
    )
    assert "--gpus N" in info.value.hint


def test_auto_keeps_a_declared_share(plugins, h100, configure):
    config = configure(
        Qwen3TTSPipeline, {"vocoder": {"gpu_memory_fraction": 0.05}}, placement={"policy": "auto"}
    )
    plan = plan_deployment(config, h100, plugins=plugins)
    assert plan.stage("vocoder").gpu_memory_fraction == 0.05
    assert plan.stage("vocoder").share_source == "declared"
    assert plan.stage("tts_engine").share_source == "estimate"


def test_auto_needs_the_hardware(plugins):
    with pytest.raises(ConfigError) as info:
        plan_deployment(Qwen3TTSPipeline(placement={"policy": "auto"}), plugins=plugins)
    assert "auto needs the number of GPUs and their memory" in info.value.message
    assert "--gpus N --gpu-memory 80GiB" in info.value.hint


def test_auto_refuses_a_stage_without_estimate(plugins, h100):
    from omni_core.plugins import OmniPlugins

    bare = OmniPlugins(load_entry_points=False)  # no model plugin: nobody estimates
    with pytest.raises(ConfigError) as info:
        plan_deployment(Qwen3OmniTextPipeline(placement={"policy": "auto"}), h100, bare)
    for stage in ("image_encoder", "audio_encoder", "mm_aggregate", "thinker"):
        assert f"stage {stage!r}: auto needs its memory" in info.value.message
    assert "placement policy declared would plan this deployment" in info.value.hint


def test_auto_spreads_replicas_it_places(plugins, h100x2):
    config = Qwen3TTSPipeline(
        placement={"policy": "auto"}, processes={"pipeline": {"num_replicas": 4}}
    )
    plan = plan_deployment(config, h100x2, plugins=plugins)
    assert [p.gpu for p in plan.processes] == [0, 1, 0, 1]


def test_auto_places_tensor_parallel_ranks_on_distinct_gpus(plugins, tp_pipeline):
    config = tp_pipeline(placement={"policy": "auto"})
    plan = plan_deployment(config, GpuInventory.uniform(3, 80 * GiB), plugins=plugins)
    gpus = plan.stage("big").gpus
    assert len(set(gpus)) == 2
    assert plan.stage("back").gpus[0] not in gpus  # the most free GPU left


def test_declared_failure_suggests_auto_when_it_would_work(plugins, h100x2):
    config = Qwen3TTSPipeline(processes={"pipeline": {"num_replicas": 2}})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, h100x2, plugins=plugins)
    # (an installed policy plugin, such as the walk-through's, may be named beside it)
    assert re.search(
        r"placement polic(y|ies) (\S+, )*auto(, \S+)* would plan this deployment as configured",
        info.value.hint,
    ), info.value.hint
    assert "--placement.policy auto" in info.value.hint
