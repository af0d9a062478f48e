"""Attention for one new position per sequence, on the CPU in bf16, as two batched products.

Why: a decode step asks attention for one query per sequence, and torch's
fused CPU kernel (``scaled_dot_product_attention``'s flash path) runs that
shape slowly in bf16, slower the more sequences and keys there are
(measured here, 2 threads, 16 query / 8 KV heads of 128: 59 us at one
sequence of 16 keys, 387 us at one of 200, 2994 us at eight of 200 and
14.9 ms at eight of 1000; float32 takes 58 and 482 us for the 200-key
shapes). Grouping each KV head's query heads into one matrix and
multiplying by the keys, then by the values, takes 68, 94, 307 and 2139 us
for the same four: at eight sequences the Qwen3-TTS talker's 28 layers
spent more time in this kernel than in reading their weights.

Numerics are those of transformers' ``eager`` attention, the other form
the references run: scores are a bf16 product (float32 accumulation,
rounded once), softmax in float32 with the scale applied there, the
weights rounded to bf16 for the product with the values. The fused kernel
keeps scores in float32; the two differ by bf16 rounding (largest
difference from a float32 computation, 200 keys: 0.004 against 0.0014 in
outputs of about 0.07), which the bf16 fidelity tests against the
references allow for. Float32, other devices and several query positions
(a prompt) keep the fused kernel, which is fast and exact there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: The fewest keys in a step (sequences x keys each) for which the grouped form is
#: taken: below it the fused kernel's single call beats the grouped form's five
#: (measured here: 0.86x at one sequence of 16 keys, 1.65x at 64, 1.29x at four of 8).
GROUPED_MIN_KEYS = 32


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, mask)`` with grouped heads, on the faster form.

    ``q`` ``[B, H, T, D]``, ``k``/``v`` ``[B, KV, S, D]`` (``H`` a multiple
    of ``KV``: query head ``h`` reads KV head ``h // (H / KV)``), ``mask``
    boolean ``[B, 1, T, S]`` (True = attend) or None; every query sees at
    least one key.
    """
    if (
        q.shape[2] == 1
        and q.dtype == torch.bfloat16
        and q.is_cpu
        and q.shape[0] * k.shape[2] >= GROUPED_MIN_KEYS
    ):
        return grouped_single_query(q, k, v, mask)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )


def grouped_single_query(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """One query position per sequence: each KV head's query heads as the rows of one product."""
    batch, heads, _, head_dim = q.shape
    kv_heads = k.shape[1]
    rows = q.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    scores = torch.matmul(rows, k.transpose(-1, -2))  # [B, KV, G, S]
    if mask is not None:
        # [B, 1, 1, S] broadcasts over KV heads and their groups; a hidden key's
        # score becomes the lowest finite value, which softmax weighs zero.
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores.float().mul_(head_dim**-0.5), dim=-1).to(v.dtype)
    return torch.matmul(weights, v).view(batch, heads, 1, head_dim)
