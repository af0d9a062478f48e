"""Sibling projections that read the same input, computed as one product.

Why: a decode step multiplies each row by q, k and v, then by gate and up,
five weight reads where two would do. torch's bf16 matrix-vector kernel
streams one tall matrix faster than several short ones (measured here,
2 threads, the five projections of 28 layers: 20.8 against 23.5 GB/s at
hidden size 1024, 25.3 against 28.0 at 2048), while float32 through MKL
gains nothing (28.3 against 29.2, 30.3 against 30.3), so
:func:`~omni_core.engine.cpu_linear.pack_linear_weights` fuses only the bf16
layers it routes (``RowLinear``). Not int8 either: its kernel gains nothing
(12 GB/s either way).

A fused group keeps its layers: each layer's weight becomes a view of its
rows in one concatenated tensor (same parameter objects, so ties hold), so
``state_dict``, ``load_state_dict`` (which copies in place, into the views)
and code that reads ``q_proj.weight`` see what they saw. The outputs are
bit-equal to the separate products: each output is the same dot product
over the same input (checked at 1 to 17 rows, bf16 and float32).

A module opts in by naming its groups in ``sibling_projections`` and
computing them through :func:`project`. If a member is replaced or its
weight moved (``.to()``, a shard for tensor parallelism), :func:`project`
notices and computes the layers one by one again. Weights mapped from
shared memory (weight sharing) are never fused: fusing copies, and a copy
per process would undo the sharing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from . import mapped

#: Where a fused group's first layer keeps its :class:`_Fusion` (a plain
#: attribute, never a submodule: the state dict must not list the weight twice).
_FUSION = "_omni_fusion"


@dataclass(eq=False)
class _Fusion:
    """One product over the concatenated weights of ``members`` (their ``id``)."""

    members: tuple[int, ...]
    product: nn.Module
    sizes: list[int]
    #: where each member's weight must still lie; None: the members hold no weight of
    #: their own (rows of one blocked product, :func:`share_product`), nothing can move it
    addresses: tuple[int, ...] | None

    def serves(self, layers: Sequence[nn.Module]) -> bool:
        if torch.compiler.is_compiling():
            # Nothing of the members read: their ids (even their count, read from the
            # tuple) would be constants of the graph, so one compiled layer could not
            # serve its siblings (layer_regions). A compiled step always runs eagerly
            # first (StaticDecoder.warm_up), and that call dropped any fusion whose
            # members were replaced or moved.
            return True
        if tuple(id(layer) for layer in layers) != self.members:
            return False
        if self.addresses is None:
            return True
        return all(
            layer._parameters["weight"].data_ptr() == address
            for layer, address in zip(layers, self.addresses, strict=True)
        )


def project(x: torch.Tensor, *layers: nn.Module) -> tuple[torch.Tensor, ...]:
    """Each of ``layers`` applied to ``x``: one product when they were fused, else one each."""
    fusion = layers[0].__dict__.get(_FUSION)
    if fusion is not None:
        if fusion.serves(layers):
            return fusion.product(x).split(fusion.sizes, dim=-1)
        # The weights moved on (``.to()``, new parameters): free the stale copy.
        del layers[0].__dict__[_FUSION]
    return tuple(layer(x) for layer in layers)


def fuse_projections(
    groups: Iterable[Sequence[nn.Module]], kinds: tuple[type[nn.Linear], ...]
) -> int:
    """Fuse each group of layers that can be fused; return how many groups were.

    ``kinds``: the linear classes whose products gain from fusing (the caller
    knows: :func:`~omni_core.engine.cpu_linear.pack_linear_weights` passes
    ``RowLinear``); the fused product is a layer of the members' class.
    A group qualifies when every member is of one such class, over the same
    input size, dtype and device, all with a bias or all without, each
    weight its own storage (so none is fused already) and none mapped from
    shared memory. One group is copied at a time, so fusing needs one
    group's worth of extra memory.
    """
    fused = 0
    for group in groups:
        layers = tuple(group)
        if not _fusable(layers, kinds):
            continue
        with torch.no_grad():
            weight = torch.cat([layer.weight.detach() for layer in layers])
            biases = [layer.bias for layer in layers]
            bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
            sizes = [layer.out_features for layer in layers]
            for layer, rows in zip(layers, weight.split(sizes), strict=True):
                layer.weight.data = rows
            if bias is not None:
                for layer, part in zip(layers, bias.split(sizes), strict=True):
                    layer.bias.data = part
        kind = type(layers[0])
        product = kind(layers[0].in_features, sum(sizes), bias=bias is not None, device="meta")
        product.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            product.bias = nn.Parameter(bias, requires_grad=False)
        layers[0].__dict__[_FUSION] = _Fusion(
            tuple(id(layer) for layer in layers),
            product,
            sizes,
            tuple(layer.weight.data_ptr() for layer in layers),
        )
        fused += 1
    if fused:
        _return_freed_heap()
    return fused


def share_product(layers: Sequence[nn.Module], product: nn.Module) -> None:
    """Let :func:`project` compute ``layers`` as one call of ``product``, split by their widths.

    For layers that are windows of ``product``'s output and hold no weight of
    their own (:class:`~omni_core.engine.cpu_linear.BlockedRows`): the caller
    built the product; nothing is copied here.
    """
    members = tuple(id(layer) for layer in layers)
    sizes = [layer.out_features for layer in layers]
    layers[0].__dict__[_FUSION] = _Fusion(members, product, sizes, None)


def _return_freed_heap() -> None:
    """Hand the pages of the weights fusing replaced back to the OS (glibc; else nothing).

    Why: glibc keeps freed blocks under its mmap threshold (weights of a few
    MB are) in its heap, and each fused copy was allocated while its
    originals still lived, so the freed originals stayed resident: a
    Qwen3-TTS 0.6B bf16 model measured 2.65 GB before packing and 3.09 GB
    after. ``malloc_trim`` returns them (2.50 GB after).
    """
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator is its own business
        return
    trim(0)


def fuse_sibling_projections(module: nn.Module, kinds: tuple[type[nn.Linear], ...]) -> int:
    """Fuse the groups that every submodule of ``module`` names in ``sibling_projections``."""
    groups = [
        [getattr(sub, name) for name in names]
        for _, sub, names in named_groups(module, "sibling_projections")
    ]
    return fuse_projections(groups, kinds)


def named_groups(module: nn.Module, attribute: str) -> list[tuple[str, nn.Module, tuple[str, ...]]]:
    """(submodule's name, submodule, member names) for each group a submodule names in
    ``attribute`` (``sibling_projections``, or ``blocked_siblings``: the groups worth one
    product where weights are blocked for oneDNN)."""
    return [
        (prefix, sub, tuple(names))
        for prefix, sub in module.named_modules()
        for names in getattr(sub, attribute, ())
    ]


def _fusable(layers: tuple[nn.Module, ...], kinds: tuple[type[nn.Linear], ...]) -> bool:
    kind = type(layers[0])
    if len(layers) < 2 or kind not in kinds or any(type(m) is not kind for m in layers):
        return False
    if len(set(map(id, layers))) < len(layers):
        return False
    first = layers[0].weight
    return all(
        layer.in_features == layers[0].in_features
        and layer.weight.dtype == first.dtype
        and layer.weight.device == first.device
        and (layer.bias is None) == (layers[0].bias is None)
        and _owns_storage(layer.weight)
        and not layer.weight.is_shared()
        and not mapped.is_mapped(layer.weight)
        for layer in layers
    )


def _owns_storage(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is all of its storage: a view into a larger one is already
    fused, or a window of someone else's buffer that a copy would not free."""
    return weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
