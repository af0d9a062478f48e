"""omni_core.kit.source: a family's model paths, resolved and checked without loading weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_core.kit.source import ModelSource, hub_id_problems, looks_like_hub_id


@pytest.fixture
def source(tmp_path: Path) -> ModelSource:
    presets = tmp_path / "presets"
    (presets / "tiny").mkdir(parents=True)
    (presets / "tiny" / "config.json").write_text(json.dumps({"voices": ["a"]}))
    (presets / "no-config").mkdir()  # not a preset: no config.json
    return ModelSource(
        family="Demo-TTS",
        presets_dir=presets,
        example="acme/demo-tts",
        weights={"tts_engine": "", "vocoder": "codec"},
    )


def checkpoint(root: Path, *weights: str) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    for sub in weights:
        (root / sub).mkdir(parents=True, exist_ok=True)
        (root / sub / "model.safetensors").write_bytes(b"")
    return root


def test_presets_resolve_by_name_and_a_local_path_of_that_name_wins(source, tmp_path, monkeypatch):
    assert source.presets() == ["tiny"]
    for name in ("tiny", "preset:tiny"):
        resolved = source.resolve(name)
        assert resolved.preset == "tiny" and resolved.path == source.presets_dir / "tiny"
    monkeypatch.chdir(tmp_path)
    checkpoint(tmp_path / "tiny")
    assert source.resolve("tiny").preset is None


def test_a_directory_needs_a_config_and_a_non_hub_name_is_refused(source, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Demo-TTS checkpoint"):
        source.resolve(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"neither a directory, a preset \(tiny\)"):
        source.resolve("./nowhere")
    with pytest.raises(FileNotFoundError, match="downloads are off"):
        source.resolve("acme/demo-tts", allow_download=False)


def test_local_config_reads_presets_and_directories_and_never_a_hub_id(source, tmp_path):
    assert source.local_config("tiny") == {"voices": ["a"]}
    assert source.local_config(str(checkpoint(tmp_path / "ckpt"))) == {}
    assert source.local_config("acme/demo-tts") is None


def test_a_preset_needs_dummy_weights_in_every_loading_stage(source):
    problems = source.problems("tiny", {"tts_engine": "auto", "vocoder": "dummy"})
    assert len(problems) == 1
    paths, message, fix = problems[0]
    assert paths == (("model_path",), ("stages", "tts_engine", "factory", "load_format"))
    assert 'needs factory.load_format = "dummy"' in message and "'auto'" in message
    assert fix.startswith("--tts_engine.factory.load_format dummy")
    assert source.problems("tiny", {"tts_engine": "dummy"}) == []


def test_a_directory_is_checked_where_each_stage_reads_its_weights(source, tmp_path):
    both = {"tts_engine": "auto", "vocoder": "safetensors"}
    assert source.problems(str(checkpoint(tmp_path / "full", "", "codec")), both) == []
    half = checkpoint(tmp_path / "half", "")
    (problem,) = source.problems(str(half), both)
    assert problem[0][1] == ("stages", "vocoder", "factory", "load_format")
    assert str(half / "codec") in problem[1] and "'vocoder'" in problem[1]
    assert source.problems(str(half), {**both, "vocoder": "dummy"}) == []
    (bare,) = source.problems(str(tmp_path), both)
    assert "not a Demo-TTS checkpoint (no config.json)" in bare[1]


def test_without_a_weights_map_every_loading_stage_reads_the_model_directory(tmp_path):
    source = ModelSource(family="X", presets_dir=tmp_path / "none", example="a/b")
    root = checkpoint(tmp_path / "ckpt")
    problems = source.problems(str(root), {"encoder": "auto", "thinker": "auto"})
    assert [p[0][1][1] for p in problems] == ["encoder", "thinker"]


def test_a_hub_id_is_checked_for_its_form_and_nothing_else_online(source, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert looks_like_hub_id("acme/demo-tts") and not looks_like_hub_id("a/b/c")
    assert source.problems("acme/demo-tts", {"tts_engine": "auto"}) == []
    (problem,) = source.problems("acme/demo--tts", {"tts_engine": "auto"})
    assert "not a valid hub id" in problem[1] and "acme/demo-tts" in problem[2]
    (problem,) = source.problems("a/b/c", {})
    assert "neither a directory, a preset (tiny)" in problem[1]


def test_offline_a_hub_id_must_be_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (problem,) = hub_id_problems("acme/demo", "acme/demo")
    assert "HF_HUB_OFFLINE" in problem[1]
    (tmp_path / "models--acme--demo" / "snapshots" / "x").mkdir(parents=True)
    assert hub_id_problems("acme/demo", "acme/demo") == []


def test_a_family_fetches_the_shared_hub_files_unless_it_names_its_own(tmp_path):
    from omni_core.kit.source import HUB_FILES, ModelSource

    plain = ModelSource(family="Demo", presets_dir=tmp_path, example="acme/demo")
    assert tuple(plain.hub_patterns) == HUB_FILES
    assert {"*.json", "*.safetensors", "vocab.json", "merges.txt"} <= set(HUB_FILES)
