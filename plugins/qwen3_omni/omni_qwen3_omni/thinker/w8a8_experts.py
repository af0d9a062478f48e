"""A mixture's w8a8_int8 experts, their rows quantised once per product instead of per expert.

Why: ``factory.quantization = "w8a8_int8"`` makes each expert's gate/up
one int8 product and its down another (``omni_core.engine.w8a8``). Called
expert by expert, every product quantises its own few rows first: about
20 us of small operations each, two per touched expert, about 100 a
release-width layer at eight tokens. Activations are quantised per row, so
quantising all of a mixture's gathered rows at once gives every row the
bytes and the scale it gets alone: here the gathered rows are quantised
once before the gate/up products and the activations once before the down
products, and every output is the one the modules give, bit for bit
(tested). The layout is :mod:`.blocked_experts`': by product, not by expert,
whose ``grouped_rows`` and ``one_token`` run :func:`expert_rows` too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.w8a8 import W8A8Linear, W8A8Rows, quantize_rows


def w8a8_ready(experts: nn.ModuleList) -> bool:
    """Whether these experts are w8a8_int8 as ``quantize_linear_weights`` leaves a mixture:
    gate/up one bias-free product (gate rows first), down a bias-free layer; checked on the
    first expert, since the conversion treats every expert alike."""
    first = experts[0]
    gate, up, down = first.gate_proj, first.up_proj, first.down_proj
    if type(gate) is not W8A8Rows or type(up) is not W8A8Rows or type(down) is not W8A8Linear:
        return False
    return (
        up.product is gate.product
        and gate.start == 0
        and up.start == gate.stop
        and gate.bias is None
        and up.bias is None
        and gate.product.bias is None
        and down.bias is None
    )


def _products(rows: torch.Tensor, layers: list[W8A8Linear], counts: list[int]) -> torch.Tensor:
    """Layer ``i``'s product of the next ``counts[i]`` rows of ``rows`` ``[pairs, in]``,
    back to back: ``[pairs, out]`` in ``rows``' dtype, the rows quantised once."""
    quantized, scales = quantize_rows(rows)
    products, start = [], 0
    for layer, count in zip(layers, counts, strict=True):
        end = start + count
        products.append(
            layer.quantized_product(quantized[start:end], scales[start:end], rows.dtype)
        )
        start = end
    return torch.cat(products)


def expert_rows(
    experts: nn.ModuleList, rows: torch.Tensor, chosen: list[int], counts: list[int]
) -> torch.Tensor:
    """``down(silu(gate(r)) * up(r))`` of expert ``chosen[i]`` on the next ``counts[i]``
    rows of ``rows`` ``[pairs, H]``, back to back: ``[pairs, H]``."""
    inner = experts[0].gate_proj.stop
    gate_up = _products(rows, [experts[e].gate_proj.product for e in chosen], counts)
    hidden = F.silu(gate_up[:, :inner]) * gate_up[:, inner:]
    return _products(hidden, [experts[e].down_proj for e in chosen], counts)
