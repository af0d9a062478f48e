"""The decoders' RMSNorm on CUDA: one fused call, within a rounding of the release's float32 ops.

Marked ``cuda`` (run by ``benchmarks/gpu_check.py``). On the CPU the fused
call equals the spelled-out ops bit for bit (``plugins/qwen3_tts/tests/
test_layers.py``); CUDA's kernel may take its reciprocal square root another
way, so here the normalised value may move by one bfloat16 rounding step, and the
product with the weight (rounded again) by two, no more.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")


@pytest.mark.parametrize("width", [128, 1024, 2048])
def test_the_norm_on_cuda_is_the_releases_within_a_rounding(width: int) -> None:
    from omni_qwen3_tts.layers import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(width, eps=1e-6).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
        x = (torch.randn(16, 3, width, device=DEVICE) * 3).to(torch.bfloat16)
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
        spelled_out = norm.weight * normed
        fused = norm(x)
    assert fused.dtype == torch.bfloat16 and fused.shape == x.shape
    step = spelled_out.float().abs() * 2**-7  # one bfloat16 rounding step (8-bit mantissa)
    assert bool(((fused.float() - spelled_out.float()).abs() <= 2 * step + 1e-6).all())
