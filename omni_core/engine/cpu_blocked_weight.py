"""bf16 weights reordered once to oneDNN's blocked layout, and whether this CPU runs them.

Why a module of its own: both the layer that holds such a weight
(:class:`~omni_core.engine.cpu_linear.BlockedLinear`) and the timing that
decides whether to use it (:mod:`.cpu_kernel_choice`) need these two, and
the layer's module already imports the timing's.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def block_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` (bf16, CPU) reordered to oneDNN's blocked layout: a copy."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)


def blocked_product(
    x: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``blocked = block_weight(weight)``."""
    return torch.ops.mkldnn._linear_pointwise(x, blocked, bias, "none", [], "")


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
