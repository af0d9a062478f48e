"""``omni plan`` prints each stage's weight dtype and why, and refuses what cannot run well."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_core.cli import main
from omni_core.engine.precision import FLAGS_VAR

EXAMPLES = Path(__file__).parents[2] / "examples"
TTS = str(EXAMPLES / "qwen3_tts_demo.toml")


@pytest.fixture(autouse=True)
def _fresh_plugins(plugins):
    yield


def plan(capsys, *args: str) -> tuple[int, str]:
    code = main(["plan", *args, "--no-detect"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_auto_is_bf16_on_a_cpu_with_amx_and_the_codec_stays_float32(capsys, monkeypatch):
    monkeypatch.setenv(FLAGS_VAR, "avx512f amx_tile amx_bf16")
    code, out = plan(capsys, TTS)
    assert code == 0
    assert "precision tts_engine: bfloat16 (auto: release bf16, CPU has AMX)" in out
    assert "precision vocoder: float32 (auto: release fp32)" in out


def test_auto_is_float32_on_a_cpu_without_fast_bf16(capsys, monkeypatch):
    monkeypatch.setenv(FLAGS_VAR, "avx2")
    code, out = plan(capsys, TTS)
    assert code == 0
    assert "precision tts_engine: float32 (auto: release bf16, but this CPU has no" in out


def test_a_local_checkpoints_torch_dtype_decides(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(FLAGS_VAR, "amx_bf16")
    preset = Path(__import__("omni_qwen3_tts").__file__).parent / "presets" / "tiny"
    config = json.loads((preset / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
    code, out = plan(capsys, TTS, "--model-path", str(tmp_path), "--json")
    assert code == 0, out
    precisions = json.loads(out)["precisions"]
    assert precisions["tts_engine"] == {"dtype": "float32", "reason": "auto: checkpoint fp32"}


def test_float16_on_a_cpu_without_it_exits_2_naming_the_path_and_fix(capsys, monkeypatch):
    monkeypatch.setenv(FLAGS_VAR, "amx_bf16")
    code, out = plan(capsys, TTS, "--tts_engine.factory.dtype", "float16")
    assert code == 2
    assert "stages.tts_engine.factory.dtype = 'float16' on the CPU" in out
    assert 'set stages.tts_engine.factory.dtype = "auto"' in out


def test_int8_is_printed_and_needs_bf16_activations(capsys, monkeypatch):
    monkeypatch.setenv(FLAGS_VAR, "amx_bf16")
    code, out = plan(capsys, TTS, "--tts_engine.factory.quantization", "int8")
    assert code == 0
    assert "CPU has AMX; int8 weight-only linear layers)" in out
    monkeypatch.setenv(FLAGS_VAR, "")
    code, out = plan(capsys, TTS, "--tts_engine.factory.quantization", "int8")
    assert code == 2
    assert "stages.tts_engine.factory.quantization = 'int8' with float32 activations" in out


def test_int8_on_a_gpu_is_refused(capsys):
    moss = str(EXAMPLES / "moss_tts.toml")
    code, out = main(["plan", moss, "--tts_engine.factory.quantization", "int8"]), ""
    out = capsys.readouterr()
    assert code == 2
    assert "not implemented yet on CUDA" in out.out + out.err


def test_w8a8_int8_is_printed_with_the_cpus_vnni_and_refused_on_a_gpu_or_in_float16(
    capsys, monkeypatch
):
    flag = "--tts_engine.factory.quantization"
    monkeypatch.setenv(FLAGS_VAR, "avx512_bf16 avx512_vnni")
    code, out = plan(capsys, TTS, flag, "w8a8_int8")
    assert code == 0, out
    assert "w8a8_int8 linear layers (int8 weights and per-row int8 activations; " in out
    assert "this CPU has avx512_vnni" in out
    monkeypatch.setenv(FLAGS_VAR, "")  # float32 activations are taken, and no VNNI is said
    code, out = plan(capsys, TTS, flag, "w8a8_int8")
    assert code == 0, out
    assert "tts_engine: float32" in out and "this CPU has no VNNI" in out
    monkeypatch.setenv(FLAGS_VAR, "avx512_fp16")  # float16 runs fast here, but not w8a8_int8
    code, out = plan(capsys, TTS, flag, "w8a8_int8", "--tts_engine.factory.dtype", "float16")
    assert code == 2
    assert "'w8a8_int8' with float16 activations" in out
    code = main(["plan", str(EXAMPLES / "moss_tts.toml"), flag, "w8a8_int8"])
    out = capsys.readouterr()
    assert code == 2
    assert "'w8a8_int8' on a GPU" in out.out + out.err


def test_the_memory_estimate_counts_the_dtype_and_int8_weights():
    from omni_core.plan.estimates import engine_estimate
    from omni_moss_tts.pipeline import MossTTSPipeline

    stage = next(s for s in MossTTSPipeline().stages if s.name == "tts_engine")
    shape = {"layers": 2, "kv_heads": 1, "head_dim": 4}

    def estimate(**factory):
        changed = stage.model_copy(update={"factory": stage.factory.model_copy(update=factory)})
        return engine_estimate(changed, 1000, shape, source="x", overhead_bytes=0)

    def weights(**factory) -> int:
        return estimate(**factory).weights_bytes

    assert weights() == 2000  # auto on a GPU: the release's bf16
    assert weights(dtype="float32") == 4000
    assert weights(dtype="auto", quantization="int8") == 1000
    assert weights(dtype="float32", quantization="w8a8_int8") == 1000
    assert "per-row int8 activations" in estimate(quantization="w8a8_int8").source
    # bf16 weights and a float16 copy of each (factory.fp16_row_weights)
    assert weights(dtype="auto", fp16_row_weights=True) == 4000
    assert "float16 row copies" in estimate(fp16_row_weights=True).source


def test_fp16_row_copies_are_printed_and_need_bf16_cpu_weights_without_int8(capsys, monkeypatch):
    monkeypatch.setenv(FLAGS_VAR, "amx_bf16")
    flag = "--tts_engine.factory.fp16_row_weights"
    code, out = plan(capsys, TTS, flag, "true")
    assert code == 0, out
    assert "float16 copies of the blocked linear weights for one- and two-row products" in out
    code, out = plan(capsys, TTS, flag, "true", "--tts_engine.factory.quantization", "int8")
    assert code == 2
    assert "fp16_row_weights = true with factory.quantization = 'int8'" in out
    monkeypatch.setenv(FLAGS_VAR, "")
    code, out = plan(capsys, TTS, flag, "true")
    assert code == 2
    assert "stages.tts_engine.factory.fp16_row_weights = true with float32 weights" in out
    moss = str(EXAMPLES / "moss_tts.toml")
    code = main(["plan", moss, "--tts_engine.factory.fp16_row_weights", "true"])
    captured = capsys.readouterr()
    assert code == 2
    assert "fp16_row_weights = true on a GPU" in captured.out + captured.err
