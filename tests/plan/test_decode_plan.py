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


def test_compiling_with_the_default_startup_timeout_is_told_to_raise_it(capsys):
    """Every bucket compiles before the process says ready: minutes, against 120 s."""
    code, out = plan(capsys, TTS, *COMPILE)
    assert code == 0, out
    note = next(s for s in out.splitlines() if s.startswith("note: tts_engine compiles its"))
    assert "runtime.startup_timeout is 120 s: raise it (--runtime.startup_timeout 1800)" in note
    code, out = plan(capsys, TTS, *COMPILE, "--runtime.startup_timeout", "900")
    assert code == 0, out
    assert "startup_timeout" not in out  # long enough: nothing to say
    code, out = plan(capsys, TTS)  # eager: nothing compiles
    assert code == 0, out
    assert "startup_timeout" not in out


def test_the_note_names_every_compiling_stage_and_none_that_runs_eagerly():
    from types import SimpleNamespace

    from omni_core.plan.decode import compile_startup_note

    config = SimpleNamespace(runtime=SimpleNamespace(startup_timeout=300.0))
    decodes = {
        "thinker": "torch.compile for batch sizes 1, 2",
        "talker_ar": "torch.compile + CUDA graphs for batch sizes 1",
        "asr": "eager decode (engine.enable_torch_compile is off)",
    }
    note = compile_startup_note(config, decodes)
    assert note is not None
    assert note.startswith("talker_ar, thinker compile their decode steps")
    assert "their processes say ready" in note and "asr" not in note
    assert "runtime.startup_timeout is 300 s" in note


def test_the_prefill_plan_says_where_long_prompts_go(capsys):
    code, out = plan(capsys, TTS)
    assert code == 0, out
    line = next(s for s in out.splitlines() if s.startswith("prefill tts_engine:"))
    assert "at most 8192 prompt positions a step (engine.max_prefill_tokens)" in line
    assert "a longer prompt in chunks of 8192" in line and "where the model offers it" in line
    assert "prefill vocoder" not in out  # not an engine stage
    code, out = plan(capsys, TTS, "--tts_engine.engine.chunked_prefill_size", "512", "--json")
    assert code == 0, out
    words = json.loads(out)["prefills"]["tts_engine"]
    assert "a prompt over 512 positions in chunks of 512" in words
    code, out = plan(capsys, TTS, "--tts_engine.engine.chunked_prefill_size", "-1")
    assert code == 0, out
    assert "a longer prompt is refused (engine.chunked_prefill_size is -1)" in out
