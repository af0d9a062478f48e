"""int8 weight-only linear layers (``factory.quantization = "int8"``): half of bf16's bytes.

Why: a decode step reads every weight once for a handful of rows, so its
time is the weights' bytes over the memory bandwidth. Storing the large
matrices as int8 with one scale per output channel halves what bfloat16
reads. The matmul is torch's own kernel, ``aten._weight_int8pack_mm`` (int8
weights, per-channel scales, activations in bfloat16 / float16), not
hand-written arithmetic: the weights are dequantised inside the kernel.

Quantized at load, after the checkpoint's weights are in: symmetric
per-output-channel scales ``max|w| / 127``, weights rounded to the nearest
step. Only large ``nn.Linear`` layers are converted: at least
``min_elements`` weights, or a quarter of the largest layer's in a model
smaller than that (small ones live in cache, where bytes do not bound the
time; the quarter rule lets the tiny test models exercise the same path),
and never output heads (``*head*``, ``lm_head``): their logits pick tokens,
and they read few bytes next to the body. Embeddings are tables, not
``nn.Linear``, and stay as they are.

Where it runs: torch's CPU kernel, with bfloat16 (or float16) activations;
float32 activations run the same kernel several times slower than float32
weights would, so a float32 stage is refused (:func:`quantization_problem`).
That kernel's time grows with every row (it reads a weight at the
memory's speed for one row, and is bound by arithmetic from two on), so a
call with many rows -- a prompt's prefill -- takes another route: the int8
weight is copied into a reusable bf16 scratch and multiplied by oneDNN's
matmul, the scales applied to the output (:data:`DEQUANTIZE_MIN_ROWS`).
Imported only in stage processes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_linear import BlockedLinear, BlockedRows, RowLinear
from .heap import return_freed_memory

DEFAULT_MIN_ELEMENTS = 1 << 20  # 2 MiB of bf16: beyond the per-core caches
QUANTIZATIONS = ("none", "int8")

#: From this many rows a call dequantizes into the scratch and runs a bf16 matmul.
#: Measured here (2 threads, bf16): 12288x4096 at 8 / 24 / 64 / 200 rows, the int8
#: kernel 4.5 / 13.5 / 36 / 111 ms against 10.7 / 11.5 / 16.7 / 20.5 ms; 3072x1024
#: crosses over at 16 rows. Decode batches stay below it, prefills go above.
DEQUANTIZE_MIN_ROWS = 24

_scratch = threading.local()


def _dequantize_scratch(qweight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``qweight`` copied into this thread's reusable ``dtype`` buffer (a view of it).

    Reused because a fresh tensor of a large layer costs more in page faults
    than the copy (measured: 12288x4096 int8 -> bf16, 35 ms into a new tensor,
    8 ms into a kept one). One buffer per thread, as large as the largest
    layer seen: a prefill on one thread never overwrites another's.
    """
    held = getattr(_scratch, "buffers", None)
    if held is None:
        held = _scratch.buffers = {}
    buffer = held.get(dtype)
    if buffer is None or buffer.numel() < qweight.numel():
        buffer = held[dtype] = torch.empty(qweight.numel(), dtype=dtype)
    return buffer[: qweight.numel()].view(qweight.shape).copy_(qweight)


def quantization_problem(quantization: str, dtype: torch.dtype, device: torch.device) -> str | None:
    """Why ``quantization`` cannot run on ``device`` with ``dtype`` activations, or None."""
    if quantization in (None, "none"):
        return None
    if quantization not in QUANTIZATIONS:
        return f"quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}"
    if torch.device(device).type != "cpu":
        return (
            "int8 weight-only layers use torch's CPU kernel (aten._weight_int8pack_mm); "
            "not implemented yet on CUDA: remove factory.quantization for GPU stages"
        )
    if dtype not in (torch.bfloat16, torch.float16):
        return (
            f"int8 weight-only layers compute in bfloat16 or float16, and this stage's dtype is "
            f'{str(dtype).removeprefix("torch.")}: set factory.dtype = "bfloat16" '
            "(float32 activations make torch's int8 kernel slower than float32 weights)"
        )
    return None


class Int8Linear(nn.Module):
    """``nn.Linear`` with int8 weights and per-output-channel scales; same call, same shapes."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        dtype = weight.dtype
        w32 = weight.float()
        scales = w32.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w32 / scales[:, None]).clamp(-128, 127).to(torch.int8)
        self.register_buffer("qweight", q.contiguous())
        self.register_buffer("scales", scales.to(dtype))
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight, for code that inspects weights (never on the hot path)."""
        return self.qweight.to(self.scales.dtype) * self.scales[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.in_features)
        if flat.dtype != self.scales.dtype:
            flat = flat.to(self.scales.dtype)
        if flat.shape[0] >= DEQUANTIZE_MIN_ROWS and not torch.compiler.is_compiling():
            # Per-output-channel scales factor out of the product: (x q^T) * s = x (q s)^T.
            weight = _dequantize_scratch(self.qweight, flat.dtype)
            out = F.linear(flat, weight) * self.scales
        else:
            out = torch.ops.aten._weight_int8pack_mm(flat.contiguous(), self.qweight, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8=per-channel"


def is_head(name: str) -> bool:
    """Output heads keep their dtype: ``codec_head``, ``lm_head``, ``heads.3`` …"""
    leaf = name.rsplit(".", 2)
    return any("head" in part for part in leaf[-2:])


def quantize_linear_weights(
    module: nn.Module,
    min_elements: int = DEFAULT_MIN_ELEMENTS,
    skip: Callable[[str], bool] | None = None,
) -> int:
    """Replace every eligible ``nn.Linear`` under ``module`` with :class:`Int8Linear`; count them.

    Eligible: bfloat16 or float16 weights on the CPU, at least
    ``min_elements`` of them (or a quarter of the largest), not a head
    (:func:`is_head`), not named by ``skip``. Idempotent (a converted layer is
    no longer an ``nn.Linear``); a layer shared by several parents is
    converted once and stays shared.
    """
    # Sizes, not the layers: a list holding every layer would keep each one's
    # weight alive until the last is converted, the whole model twice over.
    candidates = [
        (parent, name, _stored(child).numel())
        for prefix, parent in module.named_modules()
        for name, child in parent.named_children()
        if type(child) in (nn.Linear, RowLinear, BlockedLinear, BlockedRows)
        and _stored(child).dtype in (torch.bfloat16, torch.float16)
        and _stored(child).device.type == "cpu"
        and not is_head(f"{prefix}.{name}" if prefix else name)
        and not (skip and skip(f"{prefix}.{name}" if prefix else name))
    ]
    done_sizes = [m.qweight.numel() for m in module.modules() if isinstance(m, Int8Linear)]
    largest = max([size for _, _, size in candidates] + done_sizes, default=0)
    floor = min(min_elements, largest // 4)
    targets = [(p, n) for p, n, size in candidates if size >= max(floor, 1)]
    done: dict[int, Int8Linear] = {}
    for parent, name in targets:
        child = getattr(parent, name)
        if id(child) not in done:
            done[id(child)] = Int8Linear(child)
        setattr(parent, name, done[id(child)])
        del child  # so that a converted layer goes as soon as no parent holds it
    if done:
        return_freed_memory()
    return len(done)


def _stored(layer: nn.Module) -> torch.Tensor:
    """The weight as the layer stores it: a blocked layer's ``weight`` is a dense copy.

    A member of a blocked group (:class:`BlockedRows`) answers with the group's
    product, so that a group passes the size floor, or not, as one: a member left
    blocked beside converted siblings would compute the whole product alone.
    """
    if isinstance(layer, BlockedRows):
        return layer.product.packed
    return layer.packed if isinstance(layer, BlockedLinear) else layer.weight


def apply_quantization(
    module: nn.Module,
    quantization: str | None,
    *,
    stage: str,
    skip: Callable[[str], bool] | None = None,
) -> int:
    """A stage factory's one call: refuse what cannot run here (ValueError), else convert."""
    if quantization in (None, "none"):
        return 0
    param = next(module.parameters())
    problem = quantization_problem(str(quantization), param.dtype, param.device)
    if problem is not None:
        raise ValueError(f"stage {stage!r}: factory.quantization = {quantization!r}: {problem}")
    return quantize_linear_weights(module, skip=skip)
