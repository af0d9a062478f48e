"""Causal windowed self-attention with rotary positions, as the tokenizer's transformers use it.

Positions are absolute per row (a stream's first step is position 0), so a
chunk of a stream and the same steps of a one-pass decode see identical
rotations and identical sets of keys. Query ``q`` attends to key ``k`` when
``0 <= q - k < window`` and ``k >= 0``; keys carried from earlier chunks
sit in front of the chunk's own keys.

Numerics follow the release, because its codes and waveforms are the
reference: rotary angles are computed in float32 from float32 positions,
rotation acts on interleaved pairs ``(2i, 2i+1)`` and the rotated values
are cast back to the activation dtype; attention is PyTorch's
``scaled_dot_product_attention`` with a boolean mask. Module and parameter
names (``in_projs.0``, ``out_projs.0``) are the checkpoint's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def rope_tables(
    start: torch.Tensor, length: int, head_dim: int, max_period: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[B, 1, length, head_dim/2]`` (float32) for positions ``start[b] + t``.

    Computed once per transformer call and shared by its layers (the values
    only depend on the positions, the head size and the period).
    """
    half = torch.arange(head_dim // 2, device=start.device, dtype=torch.float32)
    freqs = torch.exp(half * (-math.log(max_period) * 2 / head_dim))
    steps = torch.arange(length, device=start.device, dtype=torch.float32)
    positions = start.float().view(-1, 1) + steps
    angles = freqs * positions.view(positions.shape[0], 1, length, 1)
    return torch.cos(angles), torch.sin(angles)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each interleaved pair of ``x`` ``[B, H, T, D]`` by the angles of ``cos``/``sin``."""
    pairs = x.unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0].float(), pairs[..., 1].float()
    out_real = real * cos - imag * sin
    out_imag = real * sin + imag * cos
    return torch.stack([out_real.to(x.dtype), out_imag.to(x.dtype)], dim=-1).flatten(-2)


def window_mask(start: torch.Tensor, past: int, length: int, window: int) -> torch.Tensor:
    """Boolean ``[B, 1, length, past + length]``: which keys each query may attend to.

    Key ``j`` of row ``b`` is at position ``start[b] - past + j``; positions
    below zero are before the stream's start (padding of a batched state).
    """
    device = start.device
    queries = start.view(-1, 1) + torch.arange(length, device=device)
    keys = start.view(-1, 1) - past + torch.arange(past + length, device=device)
    delta = queries[:, :, None] - keys[:, None, :]
    allowed = (keys[:, None, :] >= 0) & (delta >= 0) & (delta < window)
    return allowed[:, None]


class WindowedAttention(nn.Module):
    """Multi-head self-attention over the current steps and carried keys/values."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.d_model = d_model
        self.num_heads = num_heads
        # One-element lists: the release's names (it allows per-step weights, which we refuse).
        self.in_projs = nn.ModuleList([nn.Linear(d_model, 3 * d_model, bias=False)])
        self.out_projs = nn.ModuleList([nn.Linear(d_model, d_model, bias=False)])

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` ``[B, T, d]`` -> (output ``[B, T, d]``, all keys, all values).

        ``past``: rotated keys and values ``[B, H, L, head_dim]`` of the ``L``
        positions before ``x``. The returned keys/values are ``past``
        followed by this call's, for the caller to keep what it needs.
        """
        b, t, _ = x.shape
        head_dim = self.d_model // self.num_heads
        qkv = self.in_projs[0](x).reshape(b, t, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)
        cos, sin = rope
        q, k, v = rotate(qkv[0], cos, sin), rotate(qkv[1], cos, sin), qkv[2]
        if past is not None and past[0].shape[2]:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        out = F.scaled_dot_product_attention(q, k, v, mask, dropout_p=0.0)
        out = out.transpose(1, 2).reshape(b, t, self.d_model)
        return self.out_projs[0](out), k, v
