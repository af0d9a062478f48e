"""``omni plan`` prints how each torch engine stage decodes, before any process starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_core.cli import main
from omni_core.engine.precision import FLAGS_VAR

EXAMPLES = Path(__file__).parents[2] / "examples"
TTS = str(EXAMPLES / "qwen3_tts_demo.toml")
COMPILE = ("--tts_engine.engine.enable_torch_compile", "true")
PREPACK = ("--tts_engine.engine.cpu_weight_prepack", "true")


@pytest.fixture(autouse=True)
def _fresh_plugins(plugins, monkeypatch):
    monkeypatch.setenv(FLAGS_VAR, "avx512f amx_tile amx_bf16")  # auto: bf16
    yield


def plan(capsys, *args: str) -> tuple[int, str]:
    code = main(["plan", *args, "--no-detect"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_eager_by_default_saying_which_key_compiles(capsys):
    code, out = plan(capsys, TTS)
    assert code == 0, out
    assert "decode tts_engine: eager decode (engine.enable_torch_compile is off)" in out
    assert "decode vocoder" not in out  # not an engine stage


def test_compiled_and_prepacked_buckets_are_printed_and_in_the_json(capsys):
    code, out = plan(capsys, TTS, *COMPILE, *PREPACK, "--tts_engine.engine.cuda_graph_max_bs", "4")
    assert code == 0, out
    line = next(s for s in out.splitlines() if s.startswith("decode tts_engine:"))
    assert "torch.compile + weights prepacked where they fit" in line
    assert "batch sizes 1, 2, 4 " in line and "packs nothing" not in line
    code, out = plan(capsys, TTS, *COMPILE, "--json")
    assert code == 0, out
    decodes = json.loads(out)["decodes"]
    assert decodes["tts_engine"].startswith("torch.compile for batch sizes 1, 2, 4, 8, 16")


def test_prepacking_a_float32_stage_is_said_to_pack_nothing(capsys):
    code, out = plan(capsys, TTS, *COMPILE, *PREPACK, "--tts_engine.factory.dtype", "float32")
    assert code == 0, out
    assert "engine.cpu_weight_prepack packs nothing: the stage computes in float32" in out


def test_prepacking_without_compiling_exits_2_naming_the_flag(capsys):
    code, out = plan(capsys, TTS, *PREPACK)
    assert code == 2
    assert "cpu_weight_prepack packs weights into compiled steps" in out
    assert "set by --tts_engine.engine.cpu_weight_prepack" in out
