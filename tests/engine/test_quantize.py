"""int8 weight-only linear layers (omni_core.engine.quantize) on torch's own kernel."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from omni_core.engine.quantize import (
    Int8Linear,
    apply_quantization,
    quantization_problem,
    quantize_linear_weights,
)


def _linear(k: int, n: int, bias: bool = False, dtype=torch.bfloat16) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(k, n, bias=bias)
    return layer.to(dtype)


def test_an_int8_layer_matches_its_bf16_layer_within_quantization_error():
    dense = _linear(256, 96, bias=True)
    packed = Int8Linear(dense)
    assert packed.qweight.dtype is torch.int8 and packed.qweight.shape == (96, 256)
    x = torch.randn(3, 5, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        want, got = dense(x).float(), packed(x).float()
    assert got.shape == (3, 5, 96)
    # per-channel rounding error: at most half a step (max|w|/254) per weight
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert not torch.equal(got, want)  # it is the int8 kernel, not the dense weight
    dequant = packed.weight.float()
    # half a step (max/254) plus the bf16 rounding of the product
    assert (dequant - dense.weight.float()).abs().max() <= dense.weight.float().abs().max() / 100


def test_many_rows_take_the_dequantized_route_with_the_kernels_result():
    """A prefill-sized call (>= DEQUANTIZE_MIN_ROWS rows) equals the int8 kernel's result."""
    from omni_core.engine import quantize

    layer = Int8Linear(_linear(256, 96, bias=True))
    rows = quantize.DEQUANTIZE_MIN_ROWS
    x = torch.randn(rows + 5, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        kernel = torch.ops.aten._weight_int8pack_mm(x, layer.qweight, layer.scales) + layer.bias
        routed = layer(x)
        small = layer(x[: rows - 1])  # below the threshold: the int8 kernel itself
    torch.testing.assert_close(routed, kernel, rtol=1e-2, atol=1e-2)  # bf16 rounding apart
    assert torch.equal(small, kernel[: rows - 1])
    # the scratch is the thread's own and reused, as large as the largest layer seen
    scratch = quantize._scratch.buffers[torch.bfloat16]
    with torch.no_grad():
        Int8Linear(_linear(64, 32))(torch.randn(rows, 64, dtype=torch.bfloat16))
    assert quantize._scratch.buffers[torch.bfloat16] is scratch
    assert scratch.numel() >= 96 * 256


def test_only_large_non_head_bf16_layers_are_converted_once():
    model = nn.Module()
    model.body = nn.Sequential(_linear(64, 256), _linear(256, 64))
    model.small = _linear(8, 8)
    model.codec_head = _linear(64, 512)
    model.embed = nn.Embedding(100, 64).to(torch.bfloat16)
    model.fp32 = _linear(64, 256, dtype=torch.float32)
    assert quantize_linear_weights(model, min_elements=1 << 20) == 2
    assert isinstance(model.body[0], Int8Linear) and isinstance(model.body[1], Int8Linear)
    assert type(model.small) is nn.Linear  # under a quarter of the largest
    assert type(model.codec_head) is nn.Linear  # heads pick tokens: kept
    assert type(model.fp32) is nn.Linear  # float32 activations: not converted
    assert isinstance(model.embed, nn.Embedding)
    assert quantize_linear_weights(model) == 0  # idempotent


def test_a_float32_or_gpu_stage_is_refused_with_the_fix():
    assert 'factory.dtype = "bfloat16"' in quantization_problem(
        "int8", torch.float32, torch.device("cpu")
    )
    assert "not implemented yet on CUDA" in quantization_problem(
        "int8", torch.bfloat16, torch.device("cuda", 0)
    )
    assert quantization_problem("none", torch.float32, torch.device("cpu")) is None
    with pytest.raises(ValueError, match=r"stage 'tts_engine': factory\.quantization = 'int8'"):
        apply_quantization(_linear(4, 4, dtype=torch.float32), "int8", stage="tts_engine")
    assert apply_quantization(_linear(4, 4), "none", stage="tts_engine") == 0


def test_qwen3_tts_generates_with_an_int8_talker():
    from omni_qwen3_tts.model import Qwen3TTSModel

    model = Qwen3TTSModel.from_pretrained("tiny", load_format="dummy", dtype="bfloat16")
    prompt = model.prompts.custom_voice("Hello there, how are you?", "ryan", None)
    converted = apply_quantization(model.network.talker, "int8", stage="tts_engine")
    assert converted > 0
    assert type(model.talker.codec_head) is nn.Linear
    first = model.generate(prompt, max_new_tokens=4)
    assert first.shape == (4, 16)
    assert torch.equal(first, model.generate(prompt, max_new_tokens=4))  # greedy: repeatable
