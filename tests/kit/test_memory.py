"""omni_core.kit.memory: a plugin's estimates from a config, one estimator per stage."""

from __future__ import annotations

import json
from types import SimpleNamespace

from omni_core.kit.memory import by_stage, config_shapes, section, weights_only
from omni_core.placement import MemoryEstimate

TOWER = dict(layers=2, hidden=8, intermediate=16)


def stage(name: str, dtype: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, factory=SimpleNamespace(dtype=dtype))


def test_shapes_come_from_a_local_config_else_from_the_known_architecture(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"thinker_config": {"audio_config": {"encoder_layers": 5}}})
    )
    (audio, other), source = config_shapes(
        str(tmp_path), "Demo 1B", [(("thinker_config", "audio_config"), TOWER), (("x",), TOWER)]
    )
    assert audio == {**TOWER, "layers": 5} and other == TOWER
    assert source == f"{tmp_path}/config.json"
    (audio,), source = config_shapes("acme/demo", "Demo 1B", [(("thinker_config",), TOWER)])
    assert audio == TOWER and source == "Demo 1B"
    assert section({"a": {"b": 1}}, "a", "b") is None and section({"a": {}}, "a") == {}


def test_a_weights_only_stage_is_sized_in_its_factory_dtype():
    found = weights_only(stage("vocoder"), 1000, overhead=7, label="codec", default_dtype="float32")
    assert found == MemoryEstimate(4000, 0, 7, "codec, float32")
    half = weights_only(stage("vocoder", "bfloat16"), 1000, overhead=7, label="codec")
    assert half.weights_bytes == 2000 and half.source == "codec, bfloat16"


def test_by_stage_asks_each_stages_estimator_and_skips_those_without_an_answer():
    pipeline = SimpleNamespace(stages=[stage("a"), stage("b"), stage("c")])
    one = MemoryEstimate(1, 0, 0, "a")
    found = by_stage(pipeline, {"a": lambda s: one, "b": lambda s: None, "z": lambda s: one})
    assert found == {"a": one}
