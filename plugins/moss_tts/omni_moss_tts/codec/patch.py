"""Folding time steps into channels and back: the tokenizer's only change of rate.

The encoder folds each run of ``patch_size`` steps of a ``[B, C, T]`` signal
into ``C * patch_size`` channels of one step; the decoder's unfold is the
exact inverse. Channel ``c * patch_size + j`` of a folded step holds step
``j`` of channel ``c`` (the release's order, which the trained projections
depend on). Both are pure reshapes, so they need no state when streaming:
every step of the input maps to whole steps of the output.

The module has no parameters, but it keeps its slot in the encoder/decoder
lists so that checkpoint names (``decoder.1.transformer...``) keep their
indices.
"""

from __future__ import annotations

import torch
from torch import nn


class Patch(nn.Module):
    """``fold=True``: ``[B, C, T*p] -> [B, C*p, T]``; ``fold=False``: the inverse."""

    def __init__(self, patch_size: int, fold: bool):
        super().__init__()
        self.patch_size = patch_size
        self.fold = fold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t = x.shape
        p = self.patch_size
        if self.fold:
            return x.reshape(b, c, t // p, p).transpose(2, 3).reshape(b, c * p, t // p)
        return x.reshape(b, c // p, p, t).transpose(2, 3).reshape(b, c // p, t * p)

    def extra_repr(self) -> str:
        return f"patch_size={self.patch_size}, fold={self.fold}"
