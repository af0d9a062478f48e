"""The three Qwen3-Omni pipelines declare the topologies of issue 2; routing and merging work."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from omni_core import EngineStageConfig, OmniPlugins, PipelineConfig, StageConfig
from omni_core.factory import import_object
from omni_qwen3_omni.pipeline import (
    Qwen3OmniColocatedPipeline,
    Qwen3OmniSpeechPipeline,
    Qwen3OmniTextPipeline,
)
from omni_qwen3_omni.routing import (
    merge_encoder_outputs,
    route_to_aggregate,
    route_to_thinker,
)

ROUTING = "omni_qwen3_omni.routing"
SPEECH_STAGES = [
    "preprocessing",
    "image_encoder",
    "audio_encoder",
    "thinker",
    "decode",
    "talker_ar",
    "code2wav",
]
SOURCES = ["preprocessing", "image_encoder", "audio_encoder"]
PIPELINES = [Qwen3OmniSpeechPipeline, Qwen3OmniColocatedPipeline, Qwen3OmniTextPipeline]


def wiring(stage: StageConfig) -> dict[str, Any]:
    """What the issue specifies of one stage, as plain data."""
    return {
        "engine": isinstance(stage, EngineStageConfig),
        "next": stage.targets,
        "terminal": stage.terminal,
        "stream_to": stage.stream_to,
        "wait_for": stage.wait_for,
        "merge_fn": stage.merge_fn,
        "route_fn": stage.route_fn,
    }


def speech_wiring() -> dict[str, dict[str, Any]]:
    """The wiring shared by the speech pipelines (the colocated one only moves code2wav)."""
    plain = {"engine": False, "terminal": False, "stream_to": [], "wait_for": None}
    none = {"merge_fn": None, "route_fn": None}
    return {
        "preprocessing": {
            **plain,
            "next": ["image_encoder", "audio_encoder", "thinker"],
            "merge_fn": None,
            "route_fn": f"{ROUTING}:route_to_thinker",
        },
        "image_encoder": {**plain, **none, "next": ["thinker"]},
        "audio_encoder": {**plain, **none, "next": ["thinker"]},
        "thinker": {
            "engine": True,
            "next": ["decode", "talker_ar"],
            "terminal": False,
            "stream_to": ["talker_ar", "decode"],
            "wait_for": SOURCES,
            "merge_fn": f"{ROUTING}:merge_encoder_outputs",
            "route_fn": None,
        },
        "decode": {**plain, **none, "next": [], "terminal": True},
        "talker_ar": {
            **plain,
            **none,
            "engine": True,
            "next": ["code2wav"],
            "stream_to": ["code2wav"],
        },
        "code2wav": {**plain, **none, "next": [], "terminal": True},
    }


def test_speech_pipeline_wiring() -> None:
    config = Qwen3OmniSpeechPipeline()
    assert config.entry_stage == "preprocessing"
    assert config.stage_names == SPEECH_STAGES
    assert {s.name: wiring(s) for s in config.stages} == speech_wiring()
    assert Qwen3OmniSpeechPipeline.engine_stage_names() == ["thinker", "talker_ar"]


def test_speech_pipeline_runs_one_process_per_stage_on_two_gpus() -> None:
    config = Qwen3OmniSpeechPipeline()
    assert {s.name: s.process for s in config.stages} == {n: n for n in SPEECH_STAGES}
    assert {s.name: s.gpu for s in config.stages} == {
        "preprocessing": None,
        "image_encoder": 0,
        "audio_encoder": 0,
        "thinker": 0,
        "decode": None,
        "talker_ar": 1,
        "code2wav": 0,
    }
    assert config.stage("code2wav").gpu_memory_fraction == 0.02
    assert config.stage("thinker").author_kwargs == {"talker_stage": "talker_ar"}
    assert config.placement.policy == "declared"


def test_colocated_pipeline_puts_code2wav_in_the_talkers_process_on_one_gpu() -> None:
    config = Qwen3OmniColocatedPipeline()
    assert config.stage_names == SPEECH_STAGES
    assert {s.name: wiring(s) for s in config.stages} == speech_wiring()
    processes = {s.name: s.process for s in config.stages}
    assert processes == {**{n: n for n in SPEECH_STAGES}, "code2wav": "talker_ar"}
    assert {s.gpu for s in config.stages if s.uses_gpu} == {0}
    assert [s.name for s in config.stages if not s.uses_gpu] == ["preprocessing", "decode"]
    assert config.process_of(config.stage("code2wav")) == "talker_ar"
    # The colocate policy makes every GPU stage declare its share in the deploy file.
    assert Qwen3OmniColocatedPipeline.default_placement_policy == "colocate"
    assert config.placement.policy == "colocate"


def test_text_pipeline_is_one_process_without_talker() -> None:
    config = Qwen3OmniTextPipeline()
    assert config.entry_stage == "preprocessing"
    assert config.stage_names == [
        "preprocessing",
        "image_encoder",
        "audio_encoder",
        "mm_aggregate",
        "thinker",
        "decode",
    ]
    assert {s.process for s in config.stages} == {"pipeline"}
    assert {s.name: s.gpu for s in config.stages} == {
        "preprocessing": None,
        "image_encoder": 0,
        "audio_encoder": 0,
        "mm_aggregate": 0,
        "thinker": 0,
        "decode": None,
    }
    assert Qwen3OmniTextPipeline.engine_stage_names() == ["thinker"]
    preprocessing = config.stage("preprocessing")
    assert preprocessing.targets == ["image_encoder", "audio_encoder", "mm_aggregate"]
    assert preprocessing.route_fn == f"{ROUTING}:route_to_aggregate"
    aggregate = config.stage("mm_aggregate")
    assert aggregate.wait_for == SOURCES
    assert aggregate.merge_fn == f"{ROUTING}:merge_encoder_outputs"
    assert aggregate.targets == ["thinker"]
    assert config.stage("thinker").targets == ["decode"]
    assert config.stage("decode").terminal


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: p.pipeline_name)
def test_every_code_path_imports(pipeline: type[PipelineConfig]) -> None:
    for stage in pipeline().stages:
        for path in (stage.factory_path, stage.route_fn, stage.merge_fn):
            if path:
                assert callable(import_object(path, what=stage.name)), path


def test_the_entry_point_registers_the_three_pipelines() -> None:
    plugins = OmniPlugins(env={"OMNI_PLUGINS": "omni-qwen3-omni"})
    assert [plugins.pipeline(p.pipeline_name) for p in PIPELINES] == PIPELINES
    assert plugins.pipeline("Qwen3OmniMoeForConditionalGeneration") is Qwen3OmniSpeechPipeline
    for pipeline in PIPELINES:
        assert pipeline().model_path == "Qwen/Qwen3-Omni-30B-A3B-Instruct"


# -- routing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "targets"),
    [
        ({"text": "hello"}, ["thinker"]),
        ({"text": "hi", "images": ["a.png"]}, ["image_encoder", "thinker"]),
        ({"videos": ["v.mp4"]}, ["image_encoder", "thinker"]),
        ({"audios": ["q.wav"]}, ["audio_encoder", "thinker"]),
        (
            {"images": ["a.png"], "videos": ["v.mp4"], "audios": ["q.wav"]},
            ["audio_encoder", "image_encoder", "thinker"],
        ),
        ({"images": [], "audios": None}, ["thinker"]),  # empty media need no encoder
    ],
)
def test_preprocessing_routes_only_to_the_encoders_a_request_needs(
    payload: dict[str, Any], targets: list[str]
) -> None:
    assert route_to_thinker(payload) == targets
    text_targets = [t if t != "thinker" else "mm_aggregate" for t in targets]
    assert route_to_aggregate(payload) == text_targets


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: p.pipeline_name)
def test_routes_stay_within_the_declared_next_stages(pipeline: type[PipelineConfig]) -> None:
    """A route function may only choose among the targets the topology declares."""
    stage = pipeline().stage("preprocessing")
    route = import_object(stage.route_fn, what="route_fn")
    media = ["images", "videos", "audios"]
    for present in itertools.product([False, True], repeat=len(media)):
        payload = {key: ["x"] for key, on in zip(media, present, strict=True) if on}
        chosen = route(payload)
        assert set(chosen) <= set(stage.targets), payload
        assert chosen[-1] in stage.targets  # the fan-in stage always receives the request


def test_merge_keeps_the_prompt_and_attaches_each_encoder_output() -> None:
    prompt = {"input_ids": [1, 2, 3], "placeholders": {"image": [1]}}
    parts = {
        "preprocessing": prompt,
        "image_encoder": {"embeddings": "img"},
        "audio_encoder": {"embeddings": "aud"},
    }
    merged = merge_encoder_outputs(parts)
    assert merged["input_ids"] == [1, 2, 3]
    assert merged["placeholders"] == {"image": [1]}
    assert merged["encoder_outputs"] == {
        "image_encoder": {"embeddings": "img"},
        "audio_encoder": {"embeddings": "aud"},
    }
    assert "encoder_outputs" not in prompt  # the preprocessing output is not mutated


def test_merge_of_a_text_only_request_has_no_encoder_outputs() -> None:
    assert merge_encoder_outputs({"preprocessing": {"input_ids": [7]}}) == {
        "input_ids": [7],
        "encoder_outputs": {},
    }


def test_merge_without_the_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="preprocessing output"):
        merge_encoder_outputs({"image_encoder": {"embeddings": "img"}})
