"""The shared decoder layers: grouped-query attention reads shared keys in place, exactly."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from omni_qwen3_tts.layers import Attention, rope_cos_sin  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_heads_equal_heads_given_repeated_keys_bit_for_bit(dtype, monkeypatch):
    torch.manual_seed(0)
    attn = Attention(hidden=64, heads=8, kv_heads=2, head_dim=16, layer=0).to(dtype)
    x = torch.randn(2, 5, 64, dtype=dtype)
    positions = torch.arange(5)[None].expand(2, 5)
    cos, sin = rope_cos_sin(positions, 1.0 / (10000 ** (torch.arange(0, 16, 2) / 16)), dtype)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    captured = {}
    original = F.scaled_dot_product_attention

    def repeated(q, k, v, attn_mask=None, enable_gqa=False):
        captured["grouped"] = enable_gqa
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return original(q, k, v, attn_mask=attn_mask)

    with torch.no_grad():
        grouped = attn(x, cos, sin, mask)
        monkeypatch.setattr(F, "scaled_dot_product_attention", repeated)
        expected = attn(x, cos, sin, mask)
    assert captured["grouped"] is True
    assert torch.equal(grouped, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 1024), (8, 1, 2048), (2, 16, 3, 128), (4, 3, 100)])
def test_the_norm_equals_the_releases_float32_ops_bit_for_bit(dtype, shape):
    """One fused call (fewer kernels) must not move a bit on the CPU: the float32 parity
    with the references rests on it."""
    from omni_qwen3_tts.layers import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(shape[-1], eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    x = (torch.randn(*shape) * 3).to(dtype)
    x32 = x.float()
    spelled_out = norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(
        dtype
    )
    assert torch.equal(norm(x), spelled_out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotating_queries_and_keys_together_changes_no_bit(dtype):
    from omni_qwen3_tts.layers import apply_rope, rope_both

    torch.manual_seed(0)
    q = torch.randn(3, 5, 16, 8, dtype=dtype).transpose(1, 2)  # [B, heads, T, D], a view
    k = torch.randn(3, 5, 2, 8, dtype=dtype).transpose(1, 2)
    positions = torch.arange(5)[None].expand(3, 5) + torch.tensor([[0], [7], [30]])
    cos, sin = rope_cos_sin(positions, 1.0 / (10000 ** (torch.arange(0, 8, 2) / 8)), dtype)
    q_both, k_both = rope_both(q, k, cos, sin)
    assert torch.equal(q_both, apply_rope(q, cos, sin))
    assert torch.equal(k_both, apply_rope(k, cos, sin))
