"""Attention for one new position per sequence, on the CPU in bf16, as two batched products.

Why: a decode step asks attention for one query per sequence, and torch's
fused CPU kernel (``scaled_dot_product_attention``'s flash path) runs that
shape slowly in bf16, slower the more sequences and keys there are
(measured here, 2 threads, 16 query / 8 KV heads of 128: 389 us at one
sequence of 200 keys, 3011 us at eight of 200 and 15.2 ms at eight of
1000). Grouping each KV head's query heads into one matrix and multiplying
by the keys, then by the values, takes 117, 583 and 7127 us for the same
three: at eight sequences the Qwen3-TTS talker's 28 layers spent more time
in the fused kernel than in reading their weights.

Numerics: the products run in float32 over the bf16 queries, keys and
values (softmax and scale too), the output rounded to bf16 once. That is at
least as close to an exact computation as the fused kernel, which keeps
scores in float32 but rounds the probabilities to bf16 before the values
(largest difference from a float64 computation, measured on the shapes
above: equal to the fused kernel's, 0.005-0.008). Scores rounded to bf16
(transformers' ``eager`` form) were 3-6x further and put the Qwen3-Omni
talker's teacher-forced logits 5x outside the reference's own bf16 noise,
which is why the upcast is worth its copy of the keys and values. Float32,
other devices and several query positions (a prompt) keep the fused
kernel, which is fast and exact there.

Opt-in (``OMNI_CPU_ATTENTION=grouped``; ``fused``, the default, keeps torch's
kernel for every shape): the references run that same fused kernel, and with
it our bf16 decoders equal them bit for bit (the Qwen3-Omni talker's
teacher-forced logits, 31 steps: 0.0 apart), which the grouped form gives up
(0.23 at one step, a thinker token whose reference margin was 0.000 flipped)
for a gain that is small at short contexts (the thinker benchmark at
concurrency 8: attention 12.3 -> 7.3 ms of a 138-148 ms step; Qwen3-TTS about
3 %) and large at long ones (eight sequences of 1000 keys: 15.2 -> 7.1 ms a
layer). Which form a step takes also depends on its batch (see
:data:`GROUPED_MIN_KEYS`), so with it on, a request's bf16 numerics depend on
what it is batched with.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

MODE_VAR = "OMNI_CPU_ATTENTION"
MODES = ("fused", "grouped")

#: The fewest keys in a step (sequences x keys each) for which the grouped form is
#: taken: below it the fused kernel's single call beats the grouped form's several
#: (measured here: 60 against 83 us at one sequence of 16 keys, 403 against 100 at eight).
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
        grouped_enabled()
        and q.shape[2] == 1
        and q.dtype == torch.bfloat16
        and q.is_cpu
        and q.shape[0] * k.shape[2] >= GROUPED_MIN_KEYS
    ):
        return grouped_single_query(q, k, v, mask)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )


#: ``OMNI_CPU_ATTENTION`` as read at the first call (None: not read yet). A module
#: global rather than ``functools.cache``: a compiled step reads it as a constant,
#: where dynamo warns about tracing through a cache wrapper.
_grouped: bool | None = None


def grouped_enabled() -> bool:
    """Whether ``OMNI_CPU_ATTENTION`` asks for the grouped form (read once per process)."""
    global _grouped
    if _grouped is None:
        value = os.environ.get(MODE_VAR, "fused").strip().lower() or "fused"
        if value not in MODES:
            raise ValueError(f"{MODE_VAR}={value!r}: use one of {', '.join(MODES)}")
        _grouped = value == "grouped"
    return _grouped


def grouped_single_query(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """One query position per sequence: each KV head's query heads as the rows of one product."""
    batch, heads, _, head_dim = q.shape
    kv_heads = k.shape[1]
    rows = q.reshape(batch, kv_heads, heads // kv_heads, head_dim).float()
    scores = torch.matmul(rows, k.float().transpose(-1, -2))  # [B, KV, G, S]
    if mask is not None:
        # [B, 1, 1, S] broadcasts over KV heads and their groups
        scores = torch.where(mask, scores, float("-inf"))
    weights = torch.softmax(scores.mul_(head_dim**-0.5), dim=-1)
    out = torch.matmul(weights, v.float())
    return out.to(q.dtype).view(batch, heads, 1, head_dim)
