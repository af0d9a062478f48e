"""The Qwen3-TTS pipeline declares the topology of issue 2, and omni finds it."""

from __future__ import annotations

from typing import Any

from omni_core import EngineStageConfig, OmniPlugins, StageConfig
from omni_core.factory import import_object
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline


def wiring(stage: StageConfig) -> dict[str, Any]:
    """What the issue specifies of one stage, as plain data."""
    return {
        "engine": isinstance(stage, EngineStageConfig),
        "next": stage.targets,
        "terminal": stage.terminal,
        "stream_to": stage.stream_to,
        "wait_for": stage.wait_for,
        "process": stage.process,
        "gpu": stage.gpu,
    }


def test_preprocessing_then_a_streaming_engine_then_the_vocoder_in_one_process() -> None:
    config = Qwen3TTSPipeline()
    assert config.entry_stage == "preprocessing"
    assert {s.name: wiring(s) for s in config.stages} == {
        "preprocessing": {
            "engine": False,
            "next": ["tts_engine"],
            "terminal": False,
            "stream_to": [],
            "wait_for": None,
            "process": "pipeline",
            "gpu": None,
        },
        "tts_engine": {
            "engine": True,
            "next": ["vocoder"],
            "terminal": False,
            "stream_to": ["vocoder"],
            "wait_for": None,
            "process": "pipeline",
            "gpu": 0,
        },
        "vocoder": {
            "engine": False,
            "next": [],
            "terminal": True,
            "stream_to": [],
            "wait_for": None,
            "process": "pipeline",
            "gpu": 0,
        },
    }
    assert config.stage_names == ["preprocessing", "tts_engine", "vocoder"]
    assert Qwen3TTSPipeline.engine_stage_names() == ["tts_engine"]


def test_it_serves_the_qwen3_tts_checkpoints() -> None:
    assert Qwen3TTSPipeline().model_path == "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
    assert "Qwen3TTSForConditionalGeneration" in Qwen3TTSPipeline.aliases
    assert Qwen3TTSPipeline.description


def test_every_factory_path_names_a_callable() -> None:
    for stage in Qwen3TTSPipeline().stages:
        assert callable(import_object(stage.factory_path, what=stage.name)), stage.name


def test_the_entry_point_registers_the_pipeline() -> None:
    plugins = OmniPlugins(env={"OMNI_PLUGINS": "omni-qwen3-tts"})
    assert plugins.pipeline("qwen3-tts") is Qwen3TTSPipeline
    assert plugins.pipeline("Qwen3TTSForConditionalGeneration") is Qwen3TTSPipeline
