"""A mixture's experts blocked for oneDNN, run without their modules' Python.

Why: with bf16 experts blocked (``moe.block_mixtures``), a mixture's time at
decoding batch sizes is its products plus the Python around each touched
expert: three module calls, ``project``'s split and a padding per product,
about 95 us an expert, 5 ms of a release-width mixture's 31 at eight tokens
on one thread (the thinker's compiled step at concurrency 8, profiled). Here
each expert is two oneDNN calls and one activation on its weights read
straight from its layers, and where products need a floor of rows
(``bf16_blocked_min_rows``: oneDNN reads a blocked weight faster with four
rows than with one) the rows are padded once for the whole call instead of
per product: an expert with fewer rows reads a window of the gathered
matrix that runs into the next expert's rows, and keeps its own. Rows are
independent products, so every output is the one the modules give, bit for
bit (tested). Measured on a release-width mixture (2048 wide, 128 experts
of 768, top 8, one thread, four layers, best of four): 5.04 -> 4.55 ms at
one token, 32.77 -> 29.14 at eight, 53.32 -> 47.28 at sixteen.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine import cpu_linear
from omni_core.engine.cpu_blocked_weight import layer_product
from omni_core.engine.cpu_linear import BlockedLinear, BlockedRows


def blocked_floor(experts: nn.ModuleList) -> int | None:
    """The row floor of these experts' products if they run here, else None.

    They do when every expert's gate/up is one bias-free blocked product,
    gate rows first (``cpu_linear.block_as_one``), and its down a bias-free
    ``BlockedLinear``, as ``block_mixtures`` leaves them; checked on the first
    expert, since that function blocks a mixture's experts together.
    """
    first = experts[0]
    gate, up, down = first.gate_proj, first.up_proj, first.down_proj
    if type(gate) is not BlockedRows or type(down) is not BlockedLinear:
        return None
    if up.__dict__.get("product") is not gate.product or gate.start != 0:
        return None
    if gate.product.bias is not None or down.bias is not None:
        return None
    if down.__dict__.get("row_copy") is not None:
        # float16 copies (factory.fp16_row_weights) take an expert's one or two rows as
        # they are: padded to a floor, every expert would read its blocked weight instead
        return 0
    return cpu_linear.routes().bf16_blocked_min_rows


def _expert(expert: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(rows)) * up(rows))`` through the blocked weights (or their float16
    copies, for one or two rows), no padding."""
    gate_up = layer_product(expert.gate_proj.product, rows, None, 0)
    inner = expert.gate_proj.stop
    return layer_product(expert.down_proj, F.silu(gate_up[:, :inner]) * gate_up[:, inner:], None, 0)


def _padded(rows: torch.Tensor, floor: int) -> torch.Tensor:
    return F.pad(rows, (0, 0, 0, floor - 1)) if floor > 1 else rows


def grouped_rows(
    experts: nn.ModuleList, picked: torch.Tensor, counts: list[int], floor: int
) -> torch.Tensor:
    """Each expert's outputs for its slice of ``picked`` ``[pairs, H]`` (pairs in expert
    order, ``counts[e]`` rows for expert ``e``): ``[pairs, H]``, in the same order."""
    padded = _padded(picked, floor)
    outputs = torch.empty_like(picked)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            end = start + count
            window = padded[start : start + max(count, floor)]
            outputs[start:end] = _expert(experts[expert], window)[:count]
            start = end
    return outputs


def one_token(
    experts: nn.ModuleList,
    x: torch.Tensor,
    weights: torch.Tensor,
    chosen: list[int],
    out: torch.Tensor,
    floor: int,
) -> torch.Tensor:
    """A lone token ``x`` ``[1, H]``: its ``chosen`` experts' outputs, weighted by
    ``weights`` ``[k]``, added to ``out`` in ascending expert order (the release's sum)."""
    window = _padded(x, floor)
    for slot in sorted(range(len(chosen)), key=chosen.__getitem__):
        out += _expert(experts[chosen[slot]], window)[:1] * weights[slot]
    return out
