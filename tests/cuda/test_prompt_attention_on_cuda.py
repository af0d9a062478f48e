"""A long masked prompt's attention on CUDA writes no score matrix, and equals the math.

Marked ``cuda`` (run by ``benchmarks/gpu_check.py``). The engines attend over a
prompt chunk (up to ``engine.max_prefill_tokens``, 8192) with a mask and grouped
heads; a kernel that writes the scores would need 32 x 8192 x 8192 floats, 8.6 GB a
layer, at the thinker's shape, where the plan allows 2 GiB for all activations
(``omni_core/engine/cuda_attention.py``).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")


def _prompt(rows: int, heads: int, kv_heads: int, device, dtype=torch.bfloat16):
    gen = torch.Generator(device="cpu").manual_seed(0)

    def draw(h):
        return torch.randn(1, h, rows, 128, generator=gen).to(device, dtype)

    mask = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()[None, None]
    return draw(heads), draw(kv_heads), draw(kv_heads), mask


def test_a_thinker_sized_prompt_chunk_attends_without_a_score_matrix():
    from omni_core.engine.cpu_attention import attention

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    device = torch.device(DEVICE)
    q, k, v, mask = _prompt(8192, 32, 4, device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = attention(q, k, v, mask)
    torch.cuda.synchronize(device)
    extra = torch.cuda.max_memory_allocated(device) - before
    assert out.shape == q.shape
    # the output (64 MiB), a float mask of the boolean one (128 MiB), repeated keys and
    # values where needed (128 MiB), a kernel's workspace: far from 8.6 GB of scores
    assert extra < 1 << 30, f"{extra / 2**30:.2f} GiB for one layer's prompt attention"


def test_the_prompt_attention_equals_the_math_on_cuda():
    from omni_core.engine.cpu_attention import attention

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q, k, v, mask = _prompt(512, 16, 4, torch.device(DEVICE), torch.float32)
    mask[..., :4] = True  # not only causal: the mask is what the kernels must honour
    expected = F.scaled_dot_product_attention(
        q.cpu(), k.cpu(), v.cpu(), attn_mask=mask.cpu(), enable_gqa=True
    )
    torch.testing.assert_close(attention(q, k, v, mask).cpu(), expected, atol=2e-3, rtol=2e-3)
