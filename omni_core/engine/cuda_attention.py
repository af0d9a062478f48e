"""A prompt's attention on CUDA without a score matrix, whatever kernels this torch has.

Why: a prompt (or a chunk of one) attends with a mask (each row's start and
length), and of torch's CUDA kernels only the memory-efficient and cuDNN ones
take a mask without writing the ``[B, heads, T, S]`` scores; flash takes no
mask, and the math kernel writes them in float32. Torch builds before the
memory-efficient kernel took grouped query heads (``enable_gqa``; 2.9 still
refused them) send every masked prompt of our grouped-head models there: a
Qwen3-Omni thinker chunk of 8192 positions scores 32 heads x 8192 x 8192
floats, 8.6 GB for one layer, where the plan allows 2 GiB for all of the
engine's activations, so the first long prompt would run the GPU out of
memory.

Where no such kernel takes the grouped heads, this repeats each KV head for
its query heads: ``S x heads x head_dim`` more per layer (134 MB for 8192
keys of the thinker, in bf16), against the scores' ``T x S x heads`` floats,
so it pays from ``T > head_dim x itemsize / 4`` query rows and a decode step
(one to a few rows, captured in CUDA graphs) never does it. Torch's own
backend checks (``torch.backends.cuda.can_use_efficient_attention`` and
``can_use_cudnn_attention``) decide, once per device, dtype and head layout;
a torch without them repeats. The result is the same attention either way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def kernel_takes_grouped_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> bool:
    """Whether a masked attention of these shapes reaches a kernel that writes no scores."""
    key = (q.device, q.dtype, q.shape[1], k.shape[1], q.shape[-1], mask.dtype)
    if key not in _DECIDED:
        _DECIDED[key] = _ask_torch(q, k, v, mask)
    return _DECIDED[key]


#: What torch answered, per (device, dtype, heads, KV heads, head dim, mask dtype).
_DECIDED: dict[tuple, bool] = {}


def _ask_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> bool:
    try:
        from torch.backends.cuda import (
            SDPAParams,
            can_use_cudnn_attention,
            can_use_efficient_attention,
        )

        params = SDPAParams(q, k, v, mask, 0.0, False, True)
        return bool(can_use_efficient_attention(params) or can_use_cudnn_attention(params))
    except (ImportError, TypeError, RuntimeError):  # a torch that cannot say: repeat
        return False


def repeats_pay(q: torch.Tensor) -> bool:
    """Whether repeating the KV heads costs less than the scores of ``q``'s rows would."""
    return 4 * q.shape[2] > q.shape[-1] * q.element_size()


def grouped_prompt_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    takes: Callable[..., bool] = kernel_takes_grouped_heads,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The keys and values to hand ``scaled_dot_product_attention`` on CUDA, and its
    ``enable_gqa``.

    ``q`` ``[B, H, T, D]``, ``k``/``v`` ``[B, KV, S, D]``; ``takes``: whether a
    kernel without scores takes the grouped heads (torch's checks; tests pass
    their own).
    """
    grouped = q.shape[1] != k.shape[1]
    if not grouped or mask is None or not repeats_pay(q):
        return k, v, grouped
    if takes(q, k, v, mask):
        return k, v, True
    group = q.shape[1] // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), False
