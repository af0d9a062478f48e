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

Two ways to rotate (:class:`Rotation`): the release's arithmetic (four real
products, a difference and a sum, then the pairs interleaved again by
``stack``), for the encoder, whose codes are compared bit for bit with the
release's; and one complex product on the pairs viewed as complex numbers,
for the decoder. The complex product computes the same ``ac - bd`` and
``ad + bc`` in its vector loops, so its values are the release's there
(checked in the tests); only scalar remainders, whose compiled code may fuse
a multiply and an add, can round one element by one unit in the last
place. The decoder's waveform is compared within float rounding anyway
(its products already run through oneDNN), and the release's form costs
5-10x more: interleaving by ``stack`` is a strided copy, 2.2 ms against
0.2 ms for one call at a streamed chunk's shape ``[8, 12, 256, 64]`` here
(2 threads). Profiled over 8 streams' chunks of 2, 8, 32 and 8 frames at the
release's size, the rotations took 1.3-1.6% of the decode against 3.9-4.2%.
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
    """Rotate each interleaved pair of ``x`` ``[B, H, T, D]`` by the angles of ``cos``/``sin``.

    The release's arithmetic, operation for operation.
    """
    pairs = x.unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0].float(), pairs[..., 1].float()
    out_real = real * cos - imag * sin
    out_imag = real * sin + imag * cos
    return torch.stack([out_real.to(x.dtype), out_imag.to(x.dtype)], dim=-1).flatten(-2)


def rotate_complex(x: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    """:func:`rotate` as one complex product; ``turn`` is ``cos + i sin``, complex64."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)


class Rotation:
    """The rotary angles of one transformer call, applied by each of its layers.

    ``exact``: the release's arithmetic (:func:`rotate`); otherwise one
    complex product (:func:`rotate_complex`; the module docstring says why
    and how far they differ).
    """

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, exact: bool = True):
        self.cos, self.sin = cos, sin
        self.turn = None if exact else torch.complex(cos, sin)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.turn is None:
            return rotate(x, self.cos, self.sin)
        return rotate_complex(x, self.turn)


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
        rope: Rotation,
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
        q, k, v = rope(qkv[0]), rope(qkv[1]), qkv[2]
        if past is not None and past[0].shape[2]:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        out = F.scaled_dot_product_attention(q, k, v, mask, dropout_p=0.0)
        out = out.transpose(1, 2).reshape(b, t, self.d_model)
        return self.out_projs[0](out), k, v
