"""Routing facts of the stage graph, and wiring the runtime refuses up front."""

from __future__ import annotations

import pytest

from omni_core import PipelineConfig, StageConfig
from omni_core.errors import ConfigError
from omni_core.runtime.graph import StageGraph
from omni_qwen3_omni.pipeline import Qwen3OmniSpeechPipeline, Qwen3OmniTextPipeline


def test_skipping_both_encoders_leaves_the_thinker_waiting_for_preprocessing_only():
    graph = StageGraph.of(Qwen3OmniSpeechPipeline())
    skipped = graph.skip_closure({"image_encoder", "audio_encoder"})
    assert skipped == {"image_encoder", "audio_encoder"}
    assert graph.expected_sources("thinker", skipped) == {"preprocessing"}
    assert graph.expected_terminals(skipped) == {"decode", "code2wav"}


def test_skipping_the_talker_skips_code2wav_too():
    graph = StageGraph.of(Qwen3OmniSpeechPipeline())
    skipped = graph.skip_closure({"talker_ar"})
    assert skipped == {"talker_ar", "code2wav"}
    assert graph.expected_terminals(skipped) == {"decode"}


def test_the_text_pipeline_has_one_terminal():
    graph = StageGraph.of(Qwen3OmniTextPipeline())
    assert graph.terminals == {"decode"}
    assert graph.entry == "preprocessing"


def _config(stages: list[StageConfig]) -> PipelineConfig:
    class Pipe(PipelineConfig):
        pipeline_name = "graph-test"
        entry_stage = stages[0].name

        @classmethod
        def default_stages(cls):
            return stages

    return Pipe()


def _s(name: str, **kw) -> StageConfig:
    return StageConfig(name=name, factory_path="m:f", process="p", **kw)


@pytest.mark.parametrize(
    ("stages", "says"),
    [
        (
            [_s("a", next="b", stream_to=["c"]), _s("b", terminal=True), _s("c", terminal=True)],
            "not in 'next'",
        ),
        (
            [
                _s("a", next=["b", "c"], stream_to=["b"], route_fn="m:r"),
                _s("b", terminal=True),
                _s("c", terminal=True),
            ],
            "cannot have a route function",
        ),
        (
            [
                _s("a", next="j", stream_to=["j"]),
                _s("j", wait_for=["a"], merge_fn="m:merge", terminal=True),
            ],
            "fan-in",
        ),
        (
            [
                _s("a", next="j"),
                _s("x", next="j"),
                _s("j", wait_for=["a", "y"], merge_fn="m:merge", terminal=True),
                _s("y", terminal=True),
            ],
            "never send to it",
        ),
    ],
)
def test_wiring_the_runtime_cannot_route_is_refused(stages, says):
    with pytest.raises(ConfigError, match=says):
        StageGraph.of(_config(stages))
