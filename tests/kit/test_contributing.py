"""CONTRIBUTING's kit walk-through runs as written: its source, pipeline and plugin blocks."""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

import pytest

from omni_core.plugins import OmniPlugins

CONTRIBUTING = Path(__file__).resolve().parents[2] / "CONTRIBUTING.md"
SECTION = "## A speech model family, in the kit's terms"


def blocks() -> dict[str, str]:
    """``my_tts/<name>.py`` -> the python block that starts with that comment."""
    text = CONTRIBUTING.read_text(encoding="utf-8")
    section = text[text.index(SECTION) : text.index("\n## ", text.index(SECTION) + 1)]
    found = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        name = re.match(r"# my_tts/(\w+)\.py", block)
        if name:
            found[name.group(1)] = block
    return found


@pytest.fixture
def my_tts(tmp_path, monkeypatch):
    package = tmp_path / "my_tts"
    (package / "presets" / "tiny").mkdir(parents=True)
    (package / "presets" / "tiny" / "config.json").write_text(json.dumps({}))
    (package / "__init__.py").write_text("")
    for name, block in blocks().items():
        if name != "stages":  # an excerpt: it names the family's own tokenizer loader
            (package / f"{name}.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for module in [m for m in sys.modules if m == "my_tts" or m.startswith("my_tts.")]:
        del sys.modules[module]


def test_the_walkthrough_shows_each_piece_and_the_stages_excerpt_runs():
    found = blocks()
    assert {"source", "pipeline", "plugin", "stages"} <= set(found)
    tokenizer = type("Tokenizer", (), {"encode": staticmethod(str.split)})()
    namespace = {
        "load_my_tokenizer": lambda path: tokenizer,
        "load_my_model": lambda *args: args,
        "MyEngine": lambda *args: args,
    }
    exec(compile(found["stages"], "my_tts/stages.py", "exec"), namespace)
    stage = namespace["create_preprocessing"]("tiny", max_input_tokens=3)
    assert stage.max_frames == 4096 and stage.prepare({"input": "a b"}) == {"prompt": ["a", "b"]}
    assert "language" in stage.request_keys and "input" in stage.request_keys
    # the engine factory: the standard parameters first (the core injects them by name)
    create_tts_engine = namespace["create_tts_engine"]
    params = list(inspect.signature(create_tts_engine).parameters)
    assert params[:4] == ["model_path", "gpu_id", "gpu_memory_fraction", "engine_settings"]
    assert params[-1] == "max_frames"
    model, settings, frames = create_tts_engine("tiny", gpu_memory_fraction=0.5, seed=2)
    assert model == ("tiny", "auto", None, "cpu", 2) and frames == 4096
    assert settings.mem_fraction_static == 0.5


def test_the_family_registers_plans_its_stages_and_checks_its_model_path(my_tts):
    import my_tts.plugin

    plugins = OmniPlugins(load_entry_points=False)
    with plugins.registered(my_tts.plugin, "my-tts"):
        pipeline = plugins.pipeline("my-tts")(model_path="tiny")
    assert pipeline.stage_names == ["preprocessing", "tts_engine", "vocoder"]
    assert pipeline.stage("vocoder").factory.chunk_frames == 2
    problems = pipeline.model_source_problems()
    assert {p[0][1][1] for p in problems} == {"tts_engine", "vocoder"}
    assert all('needs factory.load_format = "dummy"' in p[1] for p in problems)
