"""bf16 weights reordered once to oneDNN's blocked layout, and whether this CPU runs them.

Why a module of its own: both the layer that holds such a weight
(:class:`~omni_core.engine.cpu_linear.BlockedLinear`) and the timing that
decides whether to use it (:mod:`.cpu_kernel_choice`) need these two, and
the layer's module already imports the timing's.

A compiled decode step calls the product through an operator of its own,
``omni::blocked_linear``, which names the weight by a number, held in the
layer's ``handle`` tensor (:func:`register_blocked`): a oneDNN blocked tensor is opaque, so neither
dynamo nor inductor can take it as an input, and turning the weights dense
again for compiling (as before) put the step on inductor's own bf16 products,
which read them slower: Qwen3-TTS 0.6B's bf16 step at concurrency 1 took
270 ms compiled against 179 eager; with the blocked products kept, 161-165 ms.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from .cpu_row_copy import row_copy_product, takes_row_copy
from .graph_handles import Handles, number_tensor


def block_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` (bf16, CPU) reordered to oneDNN's blocked layout: a copy."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)


#: The row count a product with fewer rows is padded to where padding pays (measured per
#: machine, :func:`~omni_core.engine.cpu_kernel_choice.padding_pays`).
PADDED_ROWS = 4


def blocked_product(
    x: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None = None, min_rows: int = 0
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``blocked = block_weight(weight)``.

    ``min_rows``: a product of fewer rows is computed on that many, zeros
    below its own, and cut back. Why: oneDNN's kernel for one or two rows
    reads a blocked weight slower than its kernel for four (2-core AMD EPYC,
    1024x3072 to 4096x2048 weights, one or two threads: 12-15 GB/s against
    14-20), so a decode step of one request reads its weights faster with
    three rows of zeros; the zero rows cost nothing that memory does not
    already wait for. A row's values are its own either way (rows are
    independent products); one row may round differently in its last bit
    (another kernel, another summation order).
    """
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if 0 < rows < min_rows:
        flat = F.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, min_rows - rows))
        out = torch.ops.mkldnn._linear_pointwise(flat, blocked, bias, "none", [], "")[:rows]
        return out.reshape(*x.shape[:-1], out.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(x, blocked, bias, "none", [], "")


#: Layers holding a blocked weight (``.packed``), by the number a compiled step names
#: them with. Weak: a layer that is freed leaves, and its weight with it.
_BLOCKED = Handles()


def register_blocked(layer: Any) -> None:
    """Give ``layer`` the ``handle`` tensor ``omni::blocked_linear`` finds its ``packed`` by."""
    number_tensor(layer, _BLOCKED.add(layer))


def _blocked_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    out_features: int,
    min_rows: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    return layer_product(_BLOCKED[int(weight)], x, bias, min_rows)


def layer_product(
    layer: Any, x: torch.Tensor, bias: torch.Tensor | None, min_rows: int
) -> torch.Tensor:
    """A blocked layer's product of ``x``: through its float16 copy where it holds one and
    the call has few rows (:mod:`.cpu_row_copy`), else through its blocked weight."""
    copy = takes_row_copy(layer, x)
    if copy is not None:
        return row_copy_product(x, copy, bias)
    return blocked_product(x, layer.packed, bias, min_rows)


def _blocked_linear_shape(
    x: torch.Tensor,
    weight: torch.Tensor,
    out_features: int,
    min_rows: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


# torch.library.Library rather than @custom_op, as omni::row_product (cpu_linear.py): the
# decorator's wrapper costs a few microseconds per call, and a frame makes hundreds.
_LIBRARY = torch.library.Library("omni", "FRAGMENT")
_LIBRARY.define(
    "blocked_linear(Tensor x, Tensor weight, int out_features, int min_rows, Tensor? bias)"
    " -> Tensor"
)
_LIBRARY.impl("blocked_linear", _blocked_linear, "CPU")
torch.library.register_fake("omni::blocked_linear", _blocked_linear_shape, lib=_LIBRARY)


@functools.cache
def blocking_available() -> bool:
    """Whether this torch build and CPU run blocked bf16 products (checked once, tiny layer)."""
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    needed = ("_reorder_linear_weight", "_is_mkldnn_bf16_supported", "_linear_pointwise")
    if not all(hasattr(ops, op) for op in needed) or not ops._is_mkldnn_bf16_supported():
        return False
    try:
        weight = (torch.arange(24.0).reshape(3, 8) / 24).to(torch.bfloat16)
        x = (torch.arange(16.0).reshape(2, 8) / 16).to(torch.bfloat16)
        got = blocked_product(x, block_weight(weight))
        return torch.allclose(got.float(), F.linear(x, weight).float(), atol=2e-2, rtol=2e-2)
    except (RuntimeError, NotImplementedError):  # a build without the kernel
        return False
