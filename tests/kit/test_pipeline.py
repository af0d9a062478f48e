"""omni_core.kit.pipeline: the wiring speech pipelines share, and their plan-time source checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from omni_core import FactoryArgs, PipelineConfig, StageConfig
from omni_core.kit.pipeline import (
    ChunkArgs,
    SourceChecks,
    Step,
    TTSPreprocessingArgs,
    TypedWeightArgs,
    WeightArgs,
    chain,
    tts_stages,
)
from omni_core.kit.source import ModelSource


class VocoderArgs(WeightArgs, ChunkArgs):
    chunk_frames: int = Field(default=2, ge=1)  # a family's own default wins


def test_tts_stages_wire_preprocessing_engine_and_a_streamed_vocoder():
    stages = tts_stages(
        "demo.stages",
        preprocessing=TTSPreprocessingArgs(),
        engine=TypedWeightArgs(),
        vocoder=VocoderArgs(),
    )
    pre, engine, vocoder = stages
    assert [s.name for s in stages] == ["preprocessing", "tts_engine", "vocoder"]
    assert pre.next == "tts_engine" and pre.gpu is None and not pre.is_engine
    assert engine.is_engine and engine.next == "vocoder" and engine.stream_to == ["vocoder"]
    assert vocoder.terminal and vocoder.gpu == engine.gpu == 0
    assert {s.process for s in stages} == {"pipeline"}
    assert vocoder.factory_path == "demo.stages:create_vocoder"
    assert vocoder.factory.chunk_frames == 2 and vocoder.factory.load_format == "auto"


def test_chain_names_factories_and_streams_only_where_asked():
    stages = chain(
        "asr.stages",
        [Step("preprocessing"), Step("asr", engine=True, gpu=1), Step("decode", factory_name="mk")],
        process="one",
    )
    assert [s.next for s in stages[:2]] == ["asr", "decode"] and stages[2].terminal
    assert stages[1].stream_to in (None, []) and stages[1].gpu == 1
    assert stages[2].factory_path == "asr.stages:mk" and stages[0].process == "one"


def make_pipeline(presets: Path) -> type[PipelineConfig]:
    class Demo(SourceChecks, PipelineConfig):
        pipeline_name: ClassVar[str] = "kit-demo"
        entry_stage: ClassVar[str] = "preprocessing"
        default_model_path: ClassVar[str] = "tiny"
        model_source: ClassVar = ModelSource(
            family="Demo", presets_dir=presets, example="acme/demo", weights={"tts_engine": ""}
        )

        @classmethod
        def default_stages(cls) -> list[StageConfig]:
            return tts_stages(
                "demo.stages",
                preprocessing=FactoryArgs(),
                engine=TypedWeightArgs(),
                vocoder=VocoderArgs(load_format="dummy"),
            )

    return Demo


def test_source_checks_read_every_weight_loading_stage(tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps({}))
    pipeline = make_pipeline(tmp_path)()
    assert set(pipeline.weight_factories()) == {"tts_engine", "vocoder"}
    (problem,) = pipeline.model_source_problems()  # the vocoder is already dummy
    assert problem[0][1] == ("stages", "tts_engine", "factory", "load_format")
    pipeline.fetch_model_source()  # a preset: nothing to fetch, no error


def test_a_tts_pipeline_class_needs_only_the_familys_names_and_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from omni_core.kit.pipeline import StreamingVocoderArgs, TTSPipeline

    class Family(TTSPipeline):
        pipeline_name: ClassVar[str] = "kit-family"
        default_model_path: ClassVar[str] = "acme/family"
        model_source: ClassVar = ModelSource(family="F", presets_dir=tmp_path, example="a/b")
        stages_module: ClassVar[str] = "family.stages"
        vocoder_args: ClassVar = VocoderArgs

    pipeline = Family()
    assert pipeline.stage_names == ["preprocessing", "tts_engine", "vocoder"]
    assert Family.api == ("speech",) and Family.audio_stage == "vocoder"
    assert pipeline.stage("tts_engine").factory_path == "family.stages:create_tts_engine"
    assert isinstance(pipeline.stage("vocoder").factory, VocoderArgs)
    assert isinstance(pipeline.stage("preprocessing").factory, TTSPreprocessingArgs)
    assert StreamingVocoderArgs().left_context_frames is None
    assert pipeline.model_source_problems() == []  # a well-formed hub id, online
