"""factory.dtype resolved once (omni_core.engine.precision): CPU flags are injected, never read."""

from __future__ import annotations

import pytest
import torch

from omni_core.engine.precision import (
    FLAGS_VAR,
    PrecisionError,
    canonical,
    checkpoint_dtype,
    cpu_flags,
    decide,
    read_cpu_flags,
    torch_dtype,
)

AMX = frozenset({"avx512f", "amx_tile", "amx_bf16", "amx_int8"})
AVX512_BF16 = frozenset({"avx512f", "avx512_bf16"})
PLAIN = frozenset({"avx2", "fma"})


def test_auto_is_the_checkpoints_bf16_on_a_cpu_with_amx():
    found = decide(None, device="cpu", checkpoint="bfloat16", flags=AMX)
    assert found.dtype == "bfloat16"
    assert found.describe() == "bfloat16 (auto: checkpoint bf16, CPU has AMX)"
    assert decide("auto", device="cpu", flags=AVX512_BF16).reason.endswith("AVX512-BF16")


def test_auto_is_float32_on_a_cpu_that_computes_bf16_slowly():
    found = decide("auto", device="cpu", checkpoint="bf16", flags=PLAIN)
    assert found.dtype == "float32"
    assert "no AMX/AVX512-BF16" in found.reason


def test_auto_keeps_a_float32_checkpoint_in_float32_everywhere():
    for device, flags in (("cpu", AMX), ("cuda", None)):
        found = decide(None, device=device, checkpoint="float32", flags=flags)
        assert (found.dtype, found.reason) == ("float32", "auto: checkpoint fp32")


def test_auto_on_a_gpu_is_the_checkpoints_unless_the_gpu_lacks_bf16():
    assert decide(None, device="cuda:1", gpu_name="NVIDIA H200").dtype == "bfloat16"
    old = decide(None, device="cuda", gpu_name="Tesla V100-SXM2-32GB")
    assert old.dtype == "float16" and "no bfloat16" in old.reason
    assert decide(None, device="cuda", gpu_bf16=False).dtype == "float16"


def test_an_explicit_choice_is_kept_and_says_so():
    assert decide("fp32", device="cpu", flags=AMX).describe() == "float32 (set)"
    slow = decide("bfloat16", device="cpu", flags=PLAIN)
    assert slow.dtype == "bfloat16" and "slower than float32" in slow.reason
    assert decide("float16", device="cpu", flags={"avx512_fp16"}).dtype == "float16"
    assert decide("float16", device="cuda").describe() == "float16 (set)"


def test_float16_on_a_cpu_without_fast_fp16_is_refused_with_the_fix():
    with pytest.raises(PrecisionError) as caught:
        decide("float16", device="cpu", flags=AMX, what="stages.tts_engine.factory.dtype")
    assert "stages.tts_engine.factory.dtype = 'float16'" in caught.value.message
    assert "AVX512-FP16" in caught.value.message
    assert "bfloat16" in caught.value.hint


def test_bf16_on_a_gpu_without_it_is_refused():
    with pytest.raises(PrecisionError, match="Tesla T4"):
        decide("bf16", device="cuda", gpu_name="Tesla T4")


def test_names_are_canonical_and_unknown_ones_refused():
    assert canonical("torch.bfloat16") == canonical("BF16") == "bfloat16"
    with pytest.raises(PrecisionError, match="'float13' is not a dtype name"):
        decide("float13", device="cpu", flags=AMX)


def test_the_checkpoint_dtype_comes_from_its_config_else_the_release():
    assert checkpoint_dtype({"torch_dtype": "float32"}, "bfloat16") == ("float32", "checkpoint")
    assert checkpoint_dtype({"dtype": "bfloat16"}, "float32") == ("bfloat16", "checkpoint")
    assert checkpoint_dtype({}, "float32") == ("float32", "release")
    assert checkpoint_dtype(None, "bfloat16") == ("bfloat16", "release")


def test_cpu_flags_come_from_the_environment_seam_else_cpuinfo(tmp_path):
    assert cpu_flags({FLAGS_VAR: "amx_bf16 avx512f"}) == {"amx_bf16", "avx512f"}
    assert cpu_flags({FLAGS_VAR: ""}) == frozenset()
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512_bf16\n\nprocessor\t: 1\n")
    assert read_cpu_flags(str(info)) == {"fpu", "sse2", "avx512_bf16"}
    assert read_cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_the_suite_sees_a_cpu_without_fast_bf16():
    """conftest.py pins the seam, so no test's dtype depends on the machine."""
    assert cpu_flags() == frozenset()
    assert torch_dtype(None, "cpu") is torch.float32


def test_stage_processes_resolve_with_the_same_rule(monkeypatch):
    monkeypatch.setenv(FLAGS_VAR, "amx_bf16")
    assert torch_dtype("auto", "cpu") is torch.bfloat16
    assert torch_dtype(None, "cpu", config={"torch_dtype": "float32"}) is torch.float32
    assert torch_dtype(None, "cpu", release="float32") is torch.float32
    assert torch_dtype(torch.float16, "cpu") is torch.float16  # chosen already: kept
    monkeypatch.setenv(FLAGS_VAR, "")
    with pytest.raises(ValueError, match=r"fix: set factory\.dtype"):
        torch_dtype("float16", "cpu")
