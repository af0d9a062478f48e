"""The seed's three deployments, reproduced, and the colocated refusal."""

from __future__ import annotations

import pytest

from omni_core.errors import ConfigError
from omni_core.plan import plan_deployment
from omni_qwen3_omni.pipeline import Qwen3OmniColocatedPipeline, Qwen3OmniSpeechPipeline
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

COLOCATED_SHARES = {
    "image_encoder": {"gpu_memory_fraction": 0.03},
    "audio_encoder": {"gpu_memory_fraction": 0.03},
    "thinker": {"gpu_memory_fraction": 0.78},
    "talker_ar": {"gpu_memory_fraction": 0.08},
    "code2wav": {"gpu_memory_fraction": 0.02},
}


def layout(plan):
    return [(p.name, p.gpu, list(p.stages)) for p in plan.processes]


def test_qwen3_tts_one_process_on_gpu0(plugins):
    plan = plan_deployment(Qwen3TTSPipeline(), plugins=plugins)
    assert layout(plan) == [("pipeline", 0, ["preprocessing", "tts_engine", "vocoder"])]
    gpu0 = plan.to_dict()["gpus"]["0"]
    assert gpu0["gpu_memory_fraction_sum"] == 0.0
    assert gpu0["undeclared_stages"] == ["tts_engine", "vocoder"]
    assert list(plan.gpus) == [0]
    assert plan.policy == "declared"


def test_qwen3_omni_default_seven_processes(plugins):
    plan = plan_deployment(Qwen3OmniSpeechPipeline(), plugins=plugins)
    assert layout(plan) == [
        ("preprocessing", None, ["preprocessing"]),
        ("image_encoder", 0, ["image_encoder"]),
        ("audio_encoder", 0, ["audio_encoder"]),
        ("thinker", 0, ["thinker"]),
        ("decode", None, ["decode"]),
        ("talker_ar", 1, ["talker_ar"]),
        ("code2wav", 0, ["code2wav"]),
    ]
    gpus = plan.to_dict()["gpus"]
    assert gpus["0"]["gpu_memory_fraction_sum"] == 0.02
    assert gpus["0"]["undeclared_stages"] == ["audio_encoder", "image_encoder", "thinker"]
    assert gpus["1"]["gpu_memory_fraction_sum"] == 0.0
    assert gpus["1"]["undeclared_stages"] == ["talker_ar"]
    assert gpus["1"]["processes"] == ["talker_ar"]
    assert plan.stage("code2wav").gpu_memory_fraction == 0.02


def test_qwen3_omni_colocated_with_shares(plugins, configure):
    config = configure(Qwen3OmniColocatedPipeline, COLOCATED_SHARES)
    plan = plan_deployment(config, plugins=plugins)
    assert plan.policy == "colocate"
    assert layout(plan) == [
        ("preprocessing", None, ["preprocessing"]),
        ("image_encoder", 0, ["image_encoder"]),
        ("audio_encoder", 0, ["audio_encoder"]),
        ("thinker", 0, ["thinker"]),
        ("decode", None, ["decode"]),
        ("talker_ar", 0, ["talker_ar", "code2wav"]),
    ]
    gpus = plan.to_dict()["gpus"]
    assert list(gpus) == ["0"]
    assert gpus["0"]["gpu_memory_fraction_sum"] == 0.94
    assert gpus["0"]["undeclared_stages"] == []
    assert plan.process("talker_ar").to_dict()["gpu_memory_fraction"] == 0.1


def test_qwen3_omni_colocated_without_shares_is_refused(plugins):
    with pytest.raises(ConfigError) as info:
        plan_deployment(Qwen3OmniColocatedPipeline(), plugins=plugins)
    error = info.value
    assert error.exit_code == 2
    assert "placement policy 'colocate'" in error.message
    assert "4 problems" in error.message
    for stage in ("audio_encoder", "image_encoder", "talker_ar", "thinker"):
        assert f"stage {stage!r}" in error.message
    # code2wav lives in the talker's process and is budgeted within its share
    assert "code2wav" not in error.message
    assert "gpu_memory_fraction" in error.hint


def test_colocated_policy_survives_a_placement_table_without_policy(plugins, configure):
    """Writing [placement] memory_limit must not drop the pipeline's own policy."""
    config = configure(Qwen3OmniColocatedPipeline, placement={"memory_limit": 0.9})
    with pytest.raises(ConfigError, match="placement policy 'colocate'"):
        plan_deployment(config, plugins=plugins)
