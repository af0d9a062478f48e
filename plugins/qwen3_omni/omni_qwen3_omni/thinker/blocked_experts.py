"""A mixture's experts blocked for oneDNN, run without their modules' Python.

Why: with bf16 experts blocked (``moe.block_mixtures``), a mixture's time at
decoding batch sizes is its products plus the Python around each touched
expert: three module calls, ``project``'s split and a padding per product,
about 95 us an expert, 5 ms of a release-width mixture's 31 at eight tokens
on one thread (the thinker's compiled step at concurrency 8, profiled). Here
each expert is two oneDNN calls on its weights read straight from its
layers, and where products need a floor of rows
(``bf16_blocked_min_rows``: oneDNN reads a blocked weight faster with four
rows than with one) the rows are padded once for the whole call instead of
per product: an expert with fewer rows reads a window of the gathered
matrix that runs into the next expert's rows, and keeps its own. Rows are
independent products, so every output is the one the modules give, bit for
bit (tested). Measured on a release-width mixture (2048 wide, 128 experts
of 768, top 8, one thread, four layers, best of four): 5.04 -> 4.55 ms at
one token, 32.77 -> 29.14 at eight, 53.32 -> 47.28 at sixteen.

The work is laid out by product, not by expert: every touched expert's
gate/up, then one activation over all rows, then every down, the results
put in place by one ``cat`` each. With float16 row copies
(``factory.fp16_row_weights``), where each expert's two products take
0.4 ms, the dozen small operations an expert cost before (conversions to
and from float32, slices, the activation, a copy into place) were a tenth
of a mixture's time at eight tokens: per layer, median of 12 at release
width, one thread, 21.0-21.3 against 22.8-25.7 ms at eight tokens and
3.7-4.1 against 3.9-4.4 at one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine import cpu_linear
from omni_core.engine.cpu_blocked_weight import blocked_product
from omni_core.engine.cpu_linear import BlockedLinear, BlockedRows
from omni_core.engine.cpu_row_copy import row_copy_float, row_copy_for


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


def _padded(rows: torch.Tensor, floor: int) -> torch.Tensor:
    return F.pad(rows, (0, 0, 0, floor - 1)) if floor > 1 else rows


def _products(
    rows: torch.Tensor, layers: list[nn.Module], counts: list[int], floor: int
) -> torch.Tensor:
    """Layer ``i``'s product of the next ``counts[i]`` rows of ``rows`` ``[pairs, in]``,
    back to back from row 0: ``[pairs, out]``, in ``rows``' dtype.

    A call of one or two rows takes the layer's float16 copy where it holds
    one (:func:`~omni_core.engine.cpu_row_copy.row_copy_for`), on float32
    rows converted once for all calls; the others its blocked weight, on a
    window of rows padded to ``floor`` (running into the next layer's rows,
    which it discards). The results are put in place by one ``cat``, which
    rounds the copies' float32 products to bf16 as the layer's own call does.
    """
    products = []
    pieces = padded = None
    start = 0
    for layer, count in zip(layers, counts, strict=True):
        copy = row_copy_for(layer, count)
        if copy is not None:
            if pieces is None:  # one conversion and one split for all calls
                pieces = rows.float().split(counts)
            products.append(row_copy_float(pieces[len(products)], copy))
        else:
            if padded is None:
                padded = _padded(rows, floor)
            window = padded[start : start + max(count, floor)]
            products.append(blocked_product(window, layer.packed)[:count])
        start += count
    # one copy into place for all, rounding the float16 copies' float32 products to bf16
    return torch.cat(products, out=rows.new_empty((rows.shape[0], products[0].shape[-1])))


def expert_rows(
    experts: nn.ModuleList, rows: torch.Tensor, chosen: list[int], counts: list[int], floor: int
) -> torch.Tensor:
    """``down(silu(gate(r)) * up(r))`` of expert ``chosen[i]`` on the next ``counts[i]``
    rows of ``rows`` ``[pairs, H]``, back to back: ``[pairs, H]``.

    Every expert's gate/up product first, then the activation once over all
    rows, then every down product: the activation's numbers are the same
    row by row as one call per expert gives (elementwise, rows of the same
    stride), with two operations per mixture instead of per expert.
    """
    inner = experts[0].gate_proj.stop
    gate_up = _products(rows, [experts[e].gate_proj.product for e in chosen], counts, floor)
    hidden = F.silu(gate_up[:, :inner]) * gate_up[:, inner:]
    return _products(hidden, [experts[e].down_proj for e in chosen], counts, floor)


#: ``run(experts, rows, chosen, counts)``: :func:`expert_rows` with its floor bound, or
#: another layout's (``w8a8_experts.expert_rows``); what the two helpers below take.
ExpertRows = Callable[[nn.ModuleList, torch.Tensor, list[int], list[int]], torch.Tensor]


def grouped_rows(
    run: ExpertRows, experts: nn.ModuleList, picked: torch.Tensor, counts: list[int]
) -> torch.Tensor:
    """Each expert's outputs for its slice of ``picked`` ``[pairs, H]`` (pairs in expert
    order, ``counts[e]`` rows for expert ``e``): ``[pairs, H]``, in the same order."""
    chosen = [expert for expert, count in enumerate(counts) if count]
    return run(experts, picked, chosen, [counts[e] for e in chosen])


def one_token(
    run: ExpertRows,
    experts: nn.ModuleList,
    x: torch.Tensor,
    weights: torch.Tensor,
    chosen: list[int],
    out: torch.Tensor,
) -> torch.Tensor:
    """A lone token ``x`` ``[1, H]``: its ``chosen`` experts' outputs, weighted by
    ``weights`` ``[k]``, added to ``out`` in ascending expert order (the release's sum)."""
    slots = sorted(range(len(chosen)), key=chosen.__getitem__)
    ascending = [chosen[slot] for slot in slots]
    rows = x.expand(len(chosen), x.shape[-1])
    outputs = run(experts, rows, ascending, [1] * len(chosen))
    weighted = outputs * weights[slots].unsqueeze(-1)
    for row in range(len(chosen)):
        out += weighted[row : row + 1]
    return out
