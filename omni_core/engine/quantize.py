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

from .cpu_linear import BlockedLinear, BlockedRows, PackedLinear, RowLinear
from .fused_linear import named_groups, share_product
from .heap import return_freed_memory
from .precision import QUANTIZED_KERNELS

DEFAULT_MIN_ELEMENTS = 1 << 20  # 2 MiB of bf16: beyond the per-core caches
#: ``w8a8_int8``: int8 activations too, on oneDNN's integer kernel (:mod:`.w8a8`).
QUANTIZATIONS = ("none", "int8", "w8a8_int8")

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
        layers, kernel = QUANTIZED_KERNELS[quantization]
        return (
            f"{layers} use {kernel}; not implemented yet on CUDA: remove "
            "factory.quantization for GPU stages"
        )
    if quantization == "w8a8_int8":
        return _w8a8_problem(dtype)
    if dtype not in (torch.bfloat16, torch.float16):
        return (
            f"int8 weight-only layers compute in bfloat16 or float16, and this stage's dtype is "
            f'{str(dtype).removeprefix("torch.")}: set factory.dtype = "bfloat16" '
            "(float32 activations make torch's int8 kernel slower than float32 weights)"
        )
    return None


def _w8a8_problem(dtype: torch.dtype) -> str | None:
    if dtype not in (torch.float32, torch.bfloat16):
        return (
            f"w8a8_int8 layers return float32 or bfloat16, and this stage's dtype is "
            f'{str(dtype).removeprefix("torch.")}: set factory.dtype = "bfloat16" or "float32"'
        )
    from .w8a8 import w8a8_problem

    problem = w8a8_problem()
    return None if problem is None else f"{problem}: use quantization int8 or none"


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
    scheme: str = "int8",
) -> int:
    """Replace every eligible linear layer under ``module`` with an int8 one; count the products.

    ``scheme``: ``int8`` (:class:`Int8Linear`, weight-only) or ``w8a8_int8``
    (:class:`~omni_core.engine.w8a8.W8A8Linear`). Eligible: bfloat16 or
    float16 weights on the CPU (float32 too for ``w8a8_int8``), at least
    ``min_elements`` of them (or a quarter of the largest), not a head
    (:func:`is_head`), not named by ``skip``. Idempotent (a converted layer is
    no longer a float linear layer); a layer shared by several parents is
    converted once and stays shared. ``w8a8_int8`` converts the sibling
    projections a module names in ``sibling_projections`` (q/k/v, gate/up)
    as one product each, which quantises their common input once.
    """
    dtypes = (torch.bfloat16, torch.float16)
    if scheme == "w8a8_int8":
        dtypes = (torch.float32, torch.bfloat16)
    elif scheme != "int8":
        raise ValueError(f"quantization scheme {scheme!r} is not one of int8, w8a8_int8")

    def eligible(name: str, child: nn.Module) -> bool:
        return (
            type(child) in _FLOAT_LINEAR
            and _stored(child).dtype in dtypes
            and _stored(child).device.type == "cpu"
            and not is_head(name)
            and not (skip and skip(name))
        )

    # Sizes, not the layers: a list holding every layer would keep each one's
    # weight alive until the last is converted, the whole model twice over.
    candidates = [
        (parent, name, _stored(child).numel())
        for prefix, parent in module.named_modules()
        for name, child in parent.named_children()
        if eligible(f"{prefix}.{name}" if prefix else name, child)
    ]
    groups = _w8a8_groups(module, eligible) if scheme == "w8a8_int8" else []
    done_sizes = [
        m.packed.numel() if isinstance(m, _w8a8_linear()) else m.qweight.numel()
        for m in module.modules()
        if isinstance(m, (Int8Linear, _w8a8_linear()))
    ]
    sizes = [size for _, _, size in candidates] + [size for _, _, size in groups] + done_sizes
    floor = max(min(min_elements, max(sizes, default=0) // 4), 1)
    converted = 0
    for parent, names, size in groups:
        if size >= floor:
            _convert_group(parent, names)
            converted += 1
    grouped = {(id(parent), name) for parent, names, _ in groups for name in names}
    targets = [(p, n) for p, n, size in candidates if size >= floor and (id(p), n) not in grouped]
    make = Int8Linear if scheme == "int8" else _w8a8_of
    done: dict[int, nn.Module] = {}
    for parent, name in targets:
        child = getattr(parent, name)
        if id(child) not in done:
            done[id(child)] = make(child)
        setattr(parent, name, done[id(child)])
        del child  # so that a converted layer goes as soon as no parent holds it
    converted += len(done)
    if converted:
        return_freed_memory()
    return converted


def _w8a8_linear() -> type:
    from .w8a8 import W8A8Linear

    return W8A8Linear


def _w8a8_of(layer: nn.Module) -> nn.Module:
    return _w8a8_linear()(layer.weight.detach(), layer.bias)


def _w8a8_groups(
    module: nn.Module, eligible: Callable[[str, nn.Module], bool]
) -> list[tuple[nn.Module, tuple[str, ...], int]]:
    """The sibling groups whose members may all become one product: (parent, names, size)."""
    found = []
    for prefix, parent, names in named_groups(module, "sibling_projections"):
        layers = [getattr(parent, name) for name in names]
        if (
            len(layers) < 2
            or len(set(map(id, layers))) < len(layers)
            or not all(
                eligible(f"{prefix}.{name}" if prefix else name, layer)
                for name, layer in zip(names, layers, strict=True)
            )
            or len({layer.in_features for layer in layers}) > 1
            or len({layer.bias is None for layer in layers}) > 1
        ):
            continue
        found.append(
            (parent, names, sum(layer.in_features * layer.out_features for layer in layers))
        )
    return found


def _convert_group(parent: nn.Module, names: tuple[str, ...]) -> None:
    """``parent``'s layers ``names`` as windows of one int8 product (:class:`W8A8Rows`)."""
    from .w8a8 import W8A8Rows, fused_w8a8

    layers = [getattr(parent, name) for name in names]
    products = {id(layer.product) for layer in layers if isinstance(layer, BlockedRows)}
    if len(products) == 1 and all(isinstance(layer, BlockedRows) for layer in layers):
        # rows of one blocked product already, in order: its dense weight, copied once
        whole = layers[0].product
        weights = [whole.weight[layer.start : layer.stop] for layer in layers]
    else:
        weights = [layer.weight for layer in layers]
    biases = [layer.bias for layer in layers]
    product = fused_w8a8(weights, [None] * len(layers))
    del weights
    members, start = [], 0
    for name, layer, bias in zip(names, layers, biases, strict=True):
        kept = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        member = W8A8Rows(product, start, start + layer.out_features, kept)
        setattr(parent, name, member)
        members.append(member)
        start += layer.out_features
    share_product(members, _GroupProduct(product, members))


class _GroupProduct(nn.Module):
    """A group's one call for :func:`~omni_core.engine.fused_linear.project`: the product and
    each member's bias (kept by the members, so a bias loaded later is the one added)."""

    def __init__(self, product: nn.Module, members: list[nn.Module]):
        super().__init__()
        self.__dict__["product"] = product
        self.__dict__["members"] = members

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.product(x)
        biases = [member.bias for member in self.members]
        if all(bias is None for bias in biases):
            return out
        return out + torch.cat([b.to(out.dtype) for b in biases if b is not None])


#: The float layers a conversion replaces: torch's, and the CPU routes' own (cpu_linear.py).
_FLOAT_LINEAR = (nn.Linear, RowLinear, BlockedLinear, BlockedRows, PackedLinear)


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
    return quantize_linear_weights(module, skip=skip, scheme=str(quantization))
