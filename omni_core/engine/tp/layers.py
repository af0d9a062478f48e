"""Sharded linear layers (Megatron-style) built from loaded ``nn.Linear`` modules.

A column-parallel layer keeps a contiguous slice of the output features
(q/k/v by whole heads, gate/up by intermediate columns): no communication,
each rank computes its slice. A row-parallel layer keeps the matching slice
of the input features (o_proj, down): each rank's product is a partial sum,
one all-reduce adds them, and the bias is added once, after it. A column
layer feeding a row layer therefore costs one all-reduce per pair.

The checkpoint is loaded whole and then split in place, so the dummy weights
of ``load_format = "dummy"`` (seeded, identical on every rank) and real ones
shard the same way. Slices are copied (``clone``) so the full tensor can be
freed. The results are plain ``nn.Linear`` modules (the row layer wraps one),
so the CPU's oneDNN packing (:mod:`omni_core.engine.cpu_linear`) still
applies after sharding.
"""

from __future__ import annotations

import torch
from torch import nn

from .group import TPGroup


def _span(total: int, rank: int, size: int, what: str) -> slice:
    if total % size:
        raise ValueError(f"{what} ({total}) is not divisible by tp_size {size}")
    part = total // size
    return slice(rank * part, (rank + 1) * part)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    out_features, in_features = weight.shape
    layer = nn.Linear(in_features, out_features, bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
    return layer


def split_columns(linear: nn.Linear, rank: int, size: int, what: str = "") -> nn.Linear:
    """This rank's slice of ``linear``'s output features (and bias): column-parallel."""
    span = _span(linear.out_features, rank, size, what or "output features")
    bias = None if linear.bias is None else linear.bias[span]
    return _linear(linear.weight[span], bias)


def split_rows(linear: nn.Linear, rank: int, size: int, what: str = "") -> nn.Linear:
    """This rank's slice of ``linear``'s input features, without the bias: a partial sum.

    For a caller that reduces several partial sums at once (a mixture of
    experts adds its experts' outputs first, then all-reduces once).
    """
    span = _span(linear.in_features, rank, size, what or "input features")
    return _linear(linear.weight[:, span], None)


class RowParallelLinear(nn.Module):
    """``linear`` on this rank's input slice, all-reduced over the group, plus the bias once."""

    def __init__(self, linear: nn.Linear, group: TPGroup, what: str = ""):
        super().__init__()
        self.group = group
        self.linear = split_rows(linear, group.rank, group.size, what)
        self.bias = (
            None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        self.group.all_reduce(out)
        return out if self.bias is None else out + self.bias


class AllReduceOutput(nn.Module):
    """``inner``'s output summed over the group: for a block whose outputs are partial sums."""

    def __init__(self, inner: nn.Module, group: TPGroup):
        super().__init__()
        self.inner, self.group = inner, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        self.group.all_reduce(out)
        return out
