"""Large linear layers routed to the faster CPU kernel for their row count.

Why: autoregressive decoding multiplies a handful of rows by every weight
of the model at each step, so it is bound by how fast weights stream from
memory. On the CPU, ``F.linear`` goes to MKL, whose matrix-vector kernel
reads float32 weights near the machine's bandwidth for one to three rows
but falls to half of it from four rows on; oneDNN's inner-product kernel is
the other way round (measured here, 2 threads, 1024x3072 and 3072x1024:
MKL 10-35% faster at 1-3 rows, oneDNN 1.2-1.6x faster at 4-16 rows;
``benchmarks/bench_cpu_linear.py`` prints both). :class:`PackedLinear`
sends each call to the faster one. It keeps the layer's own dense weight,
which oneDNN reads as fast as its blocked copy (within 8%) and MKL needs,
so nothing is copied and a weight shared with other processes stays
shared. The numbers do not change beyond float rounding (same float32
weights, another summation order).

bfloat16 layers take other routes: :class:`RowLinear` sends a one-row input to
``torch.mv``, whose bf16 kernel streams the weight 15 to 40% faster than
``F.linear``'s at one row (``bench_cpu_linear.py``), which is every decode
step of a lone request and every step of Qwen3-TTS's code predictor, and
up to :data:`TRANSPOSED_MAX_ROWS` rows to the transposed product
``mm(weight, x.T)``, 1.1-1.7x faster than ``F.linear`` there, and more rows
(a prompt's prefill) to ``F.linear``, which wins from about 128 rows on.

Those figures are one Intel machine's; an AMD EPYC measured every route the
other way round, and there a bf16 weight reordered once to oneDNN's blocked
layout (:class:`BlockedLinear`) streams 1.9x ``F.linear``'s dense one at 1
to 16 rows (26.5 against 14.0 GB/s at one row) and is no slower at 2048,
where on the Intel machine it read no faster. So the routes in force
(:func:`routes`) are this machine's, timed once by :mod:`.cpu_kernel_choice`
when a process first packs weights and cached for later starts;
``MKL_MAX_ROWS`` and ``TRANSPOSED_MAX_ROWS`` are the shipped defaults
(``OMNI_CPU_KERNELS=default``).

Only float32 weights on the CPU with at least ``min_elements`` elements are
routed: small ones live in cache, where MKL is as fast. Inference only: a
routed layer refuses inputs that need a gradient, and its weight leaves
``state_dict`` (save a checkpoint before packing, never after). Pack last:
``.to()`` does not move or convert a routed weight. Imported only in stage
processes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import mapped
from .cpu_blocked_weight import (
    block_weight,
    blocking_available,
    layer_product,
    register_blocked,
)
from .cpu_kernel_choice import KernelChoice, kernel_choice
from .fused_linear import fuse_sibling_projections, named_groups, share_product
from .heap import return_freed_memory

DEFAULT_MIN_ELEMENTS = 1 << 20  # 4 MiB of float32: beyond the per-core caches


MKL_MAX_ROWS = 3  # up to this many rows MKL's kernel is the faster (see the module docstring)

#: The routes in force: the shipped ones (MKL_MAX_ROWS, TRANSPOSED_MAX_ROWS) until
#: :func:`pack_linear_weights` takes this machine's (:mod:`.cpu_kernel_choice`).
_routes = KernelChoice()


def routes() -> KernelChoice:
    """The kernel routes this process's routed layers take."""
    return _routes


def use_routes(choice: KernelChoice) -> None:
    """Route the products from now on as ``choice`` says (already packed float32 layers
    keep the MKL row limit they were built with)."""
    global _routes
    _routes = choice


class PackedLinear(nn.Module):
    """``nn.Linear`` on MKL for a few rows (``MKL_MAX_ROWS``, or as measured on this
    machine), on oneDNN beyond; same inputs, same outputs."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # The layer's own tensor, never a copy: a weight shared with other processes
        # (weight sharing) stays the shared view, and either kernel reads it in place.
        self.packed = linear.weight.detach()
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), False)
        self.mkl_rows = _routes.mkl_max_rows

    @property
    def weight(self) -> torch.Tensor:
        """The weight, for code that inspects weights."""
        return self.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise TypeError(
                f"a packed linear layer takes float32 CPU inputs, got {x.dtype} on {x.device}"
            )
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("a packed linear layer is for inference: it has no gradient")
        if torch.compiler.is_compiling():
            # Opaque to inductor, which would give every row count to MKL's product: the
            # Qwen3-Omni thinker's float32 LM head (1.24 GB) at eight rows took 264 ms in
            # a compiled step against 123 on oneDNN's route (one thread)
            return torch.ops.omni.packed_linear(x, self.packed, self.bias, self.mkl_rows)
        return packed_product(x, self.packed, self.bias, self.mkl_rows)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rows<={self.mkl_rows}: MKL, more: oneDNN"
        )


def packed_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mkl_rows: int
) -> torch.Tensor:
    """:class:`PackedLinear`'s product: MKL up to ``mkl_rows`` rows, oneDNN beyond.

    Also the compiled step's operator ``omni::packed_linear``, so that a
    compiled decode step takes the same route for its batch as eager does.
    """
    if x.numel() <= mkl_rows * weight.shape[1]:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _packed_product_shape(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mkl_rows: int
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear_gelu(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(layer(x))`` (exact, erf), in one oneDNN call where ``layer`` is a
    :class:`PackedLinear` on its oneDNN route; else those two calls.

    Why: a codec decoder's MLP widens each row fourfold before the GELU, so the
    separate GELU reads and writes the widest activation of the layer once
    more. As the product's post-op it is applied while the tile is in the
    caches, with the same numbers: equal bit for bit to ``F.gelu`` after the
    product (float32, with and without bias; ``tests/engine/test_cpu_linear.py``).
    Measured on a 2-core AMD EPYC, MOSS-TTS's codec decoder, 8 streams' 32-frame
    chunks: 10.92 -> 10.10 ms per frame (alternated, best of 4), the audio 0.0 apart.
    """
    if (
        isinstance(layer, PackedLinear)
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.numel() > layer.mkl_rows * layer.in_features
        and not (x.requires_grad and torch.is_grad_enabled())
    ):
        return torch.ops.mkldnn._linear_pointwise(x, layer.packed, layer.bias, "gelu", [], "none")
    return F.gelu(layer(x))


def float32_matmul(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``rows @ weight`` (``[M, K] x [K, N]``); float32 on the CPU through oneDNN past
    this machine's MKL row limit, where ``torch.mm`` takes MKL.

    Why: a codec's transposed convolution computed as one product
    (Qwen3-TTS's upsampling, ``[chunk rows, 1536] x [1536, 12288]``) sits on MKL's
    float32 kernel, which ran at half oneDNN's speed on a 2-core AMD EPYC (128 rows:
    29.2 against 13.9 ms; 32: 11.6 against 4.9). oneDNN reads ``weight`` transposed in
    place (``weight.t()`` as its ``[N, K]``), so nothing is copied. Equal within float
    rounding (another summation order). Inference only; other dtypes and devices, and
    a build without oneDNN's kernel, take ``torch.mm``.
    """
    if (
        rows.dtype == torch.float32
        and weight.dtype == torch.float32
        and rows.device.type == "cpu"
        and rows.shape[0] > _routes.mkl_max_rows
        and not (torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad))
        and packing_available()
    ):
        return torch.ops.mkldnn._linear_pointwise(rows, weight.t(), None, "none", [], "")
    return torch.mm(rows, weight)


class BlockedLinear(nn.Module):
    """A bf16 ``nn.Linear`` whose weight is reordered once to oneDNN's blocked layout.

    Where :func:`routes` say so (``bf16_blocked``, measured per machine),
    :func:`pack_linear_weights` turns :class:`RowLinear` layers into these:
    every product, one row or a prompt's thousands, goes to oneDNN's inner
    product over the blocked weight, which on an AMD EPYC streams 1.9x the
    dense weight's fastest route at decode's row counts. Same products as
    ``F.linear`` within float rounding (the same kernel family; bit-equal on
    that machine).

    What it costs, as :class:`PackedLinear`: the blocked weight is a copy
    (the dense one is freed), so a weight mapped from another process
    (weight sharing) or tied to another module is never blocked; it leaves
    ``state_dict``; ``weight`` gives a dense copy, for code that inspects
    weights, never for the hot path; ``.to()`` does not move it.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = block_weight(linear.weight.detach())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), False)
        # what a compiled step names the weight by (omni::blocked_linear): tensor `handle`
        register_blocked(self)

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> BlockedLinear:
        """The blocked layer of ``weight`` ``[out, in]`` (bf16, CPU) and ``bias``."""
        layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        layer.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            layer.bias = nn.Parameter(bias, requires_grad=False)
        return cls(layer)

    @property
    def weight(self) -> torch.Tensor:
        """A dense copy of the weight, for code that inspects weights."""
        return self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or x.device.type != "cpu":
            raise TypeError(
                f"a blocked linear layer takes bfloat16 CPU inputs, got {x.dtype} on {x.device}"
            )
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("a blocked linear layer is for inference: it has no gradient")
        if x.numel() == 0:
            return x.new_empty((*x.shape[:-1], self.out_features))
        if torch.compiler.is_compiling():  # the opaque weight by its number, as it is
            return torch.ops.omni.blocked_linear(
                x, self.handle, self.out_features, _routes.bf16_blocked_min_rows, self.bias
            )
        return layer_product(self, x, self.bias, _routes.bf16_blocked_min_rows)

    def extra_repr(self) -> str:
        held = self.__dict__.get("row_copy") is not None
        copy = ", a float16 copy for 1-2 rows" if held else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bf16 in oneDNN's blocked layout{copy}"
        )


class BlockedRows(nn.Module):
    """One of sibling projections blocked as one product: its outputs are rows of that product's.

    Why: oneDNN reads one tall blocked weight faster than several short ones
    (measured on the AMD EPYC, 2 threads, 28 layers at hidden size 1024:
    q/k/v as one blocked product 12.5 -> 10.4 ms at one row, 12.2 -> 10.5 at
    eight; gate/up, with 2 MB pages (``huge_pages``), 20.9 -> 19.6 ms at
    one row padded, 21.9 -> 20.8 unpadded, 26.1 -> 24.8 at eight, where
    4 KB pages had measured them slower fused; a Qwen3-Omni expert's gate/up
    0.80-0.85 of the time). The groups are those a module names in
    ``blocked_siblings``. A blocked weight cannot be sliced, so the member holds no
    weight: :func:`~omni_core.engine.fused_linear.project` computes the group
    in one call. Called alone, a member computes the whole product and keeps
    its rows (right, never the hot path); ``weight`` is a dense copy of its
    rows; its bias stays its own parameter (in ``state_dict``, as
    :class:`BlockedLinear`'s).
    """

    def __init__(self, product: BlockedLinear, start: int, stop: int, bias: nn.Parameter | None):
        super().__init__()
        self.in_features, self.out_features = product.in_features, stop - start
        # A plain attribute, not a submodule: each member would list it in the state dict.
        self.__dict__["product"] = product
        self.start, self.stop = start, stop
        self.bias = bias

    @property
    def weight(self) -> torch.Tensor:
        """A dense copy of this layer's rows, for code that inspects weights."""
        return self.product.packed.to_dense()[self.start : self.stop].clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x)[..., self.start : self.stop]

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rows {self.start}:{self.stop} of a blocked product of {self.product.out_features}"
        )


class RowLinear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) on bf16's faster CPU kernels.

    A lone row goes to ``mv``; up to :data:`TRANSPOSED_MAX_ROWS` go to
    ``mm(weight, x.T).T``, the transposed product, which torch's bf16 path runs
    faster than ``F.linear``'s ``x @ weight.T`` there (every decode step of a
    batch, a mixture's experts at a few rows each); more rows, a prompt's
    prefill, go to ``F.linear`` (see :data:`TRANSPOSED_MAX_ROWS`). A layer
    becomes one by a class swap (:func:`pack_linear_weights`), so its weight
    stays the tensor it was: shared weights stay shared, ``.to()`` and
    ``state_dict`` behave as for any linear layer.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Read once, past Module.__getattr__: a Qwen3-TTS frame makes about 740
        # of these calls, most of them at one row.
        return row_linear(x, self._parameters["weight"], self._parameters["bias"])


#: The most rows :class:`RowLinear` sends to the transposed product. Measured here
#: (bf16, 2 threads; F.linear's time over the transposed product's) on 24576x4096,
#: 4096x12288, 6144x4096, 6144x1024 and 1024x3072: 1.16-1.74x from 8 to 32 rows,
#: 0.92-1.60x at 64, 0.85-1.26x at 128, 0.59-1.00x at 197 and 0.48-0.99x at 512.
#: A ~200-position prompt through MOSS-TTS's fused gate/up took 62 against 36 ms.
TRANSPOSED_MAX_ROWS = 64


def row_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on :class:`RowLinear`'s kernels where they are faster.

    For products that are not a layer of their own: a stacked set of heads
    (MOSS-TTS's 32 audio heads as one ``[32 * 1025, H]`` matrix, 268 MB of bf16
    read at every step) streamed 18.5 -> 23.4 GB/s at one row and 20.2 -> 24.8
    at eight (measured here, 2 threads), the numbers those kernels give.
    float32 on the CPU takes :class:`PackedLinear`'s routes (MKL for a few
    rows, oneDNN beyond, where MKL reads at half the speed: the same heads in
    float32, 537 MB, at eight rows); anything else goes to ``F.linear``.
    """
    if weight.dtype == torch.float32 and x.dtype == torch.float32 and x.is_cpu:
        if (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) or not (
            packing_available() and x.numel()
        ):
            return F.linear(x, weight, bias)
        if torch.compiler.is_compiling():
            return torch.ops.omni.packed_linear(x, weight, bias, _routes.mkl_max_rows)
        return packed_product(x, weight, bias, _routes.mkl_max_rows)
    if weight.dtype != torch.bfloat16 or not x.is_cpu or x.dtype != weight.dtype or x.numel() == 0:
        return F.linear(x, weight, bias)
    in_features = weight.shape[1]
    if torch.compiler.is_compiling():
        # Opaque to inductor, which would otherwise generate its own loop for
        # the product: measured here (2 threads, ten SwiGLU blocks of 3072x1024
        # bf16 weights one after another) 19 GB/s against 24 through this op.
        out = torch.ops.omni.row_product(x.reshape(-1, in_features), weight)
    elif x.numel() == in_features and _routes.bf16_mv_one_row:
        out = torch.mv(weight, x.reshape(-1))
    elif in_features < x.numel() <= _routes.bf16_transposed_max_rows * in_features:
        out = _transposed_product(x.reshape(-1, in_features), weight)
    else:
        return F.linear(x, weight, bias)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], weight.shape[0])


def row_product(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``rows @ weight.T`` (``[N, in]`` -> ``[N, out]``) on :class:`RowLinear`'s kernels.

    An operator of its own (``omni::row_product``) so that a compiled step
    calls these kernels as they are.
    """
    if rows.shape[0] == 1 and _routes.bf16_mv_one_row:
        return torch.mv(weight, rows[0])[None]
    if rows.shape[0] == 1 or rows.shape[0] > _routes.bf16_transposed_max_rows:
        return F.linear(rows, weight)
    return _transposed_product(rows, weight)


def _row_product_shape(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return rows.new_empty((rows.shape[0], weight.shape[0]))


# Declared through torch.library.Library rather than the @custom_op decorator:
# a compiled decode step calls it about 740 times per Qwen3-TTS frame, and
# the decorator's Python wrapper costs about 2 us more per call (measured here:
# 9.1 against 7.2 us per call of a compiled chain of small products).
_LIBRARY = torch.library.Library("omni", "FRAGMENT")
_LIBRARY.define("row_product(Tensor rows, Tensor weight) -> Tensor")
_LIBRARY.impl("row_product", row_product, "CPU")
torch.library.register_fake("omni::row_product", _row_product_shape, lib=_LIBRARY)
_LIBRARY.define("packed_linear(Tensor x, Tensor weight, Tensor? bias, int mkl_rows) -> Tensor")
_LIBRARY.impl("packed_linear", packed_product, "CPU")
torch.library.register_fake("omni::packed_linear", _packed_product_shape, lib=_LIBRARY)


def _transposed_product(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``rows @ weight.T`` as ``(weight @ rows.T).T``, made row-major again.

    The copy is a few rows' worth, and it matters: the transposed result's last
    dimension has a stride, which element-wise ops downstream keep, and
    attention then falls from the fused kernel to its unfused form (measured at
    Qwen3-TTS 0.6B size, batch 8: a compiled talker step 138 ms).
    """
    return torch.mm(weight, rows.t()).t().contiguous()


ROW_MIN_ELEMENTS = 1 << 16  # below this a layer lives in cache and either kernel is as fast


@functools.cache
def packing_available() -> bool:
    """Whether this torch build can run a packed layer (checked once, on a tiny layer)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    try:
        probe = nn.Linear(4, 3)
        with torch.no_grad():
            x = torch.arange(16.0).reshape(4, 4)  # 4 rows: the oneDNN route
            return torch.allclose(PackedLinear(probe)(x), probe(x), atol=1e-5)
    except (RuntimeError, NotImplementedError):  # a build without the kernel
        return False


def pack_linear_weights(
    module: nn.Module,
    min_elements: int | None = None,
    skip: Callable[[str], bool] | None = None,
) -> int:
    """Replace every eligible ``nn.Linear`` under ``module`` in place; return how many.

    Eligible: float32, on the CPU, at least ``min_elements`` weight
    elements (default :data:`DEFAULT_MIN_ELEMENTS`, read at call time), and
    not named (``layers.0.mlp.experts.3.up_proj``) by ``skip``.
    bfloat16 layers on the CPU become :class:`RowLinear` instead (counted too),
    and those that a module names in ``sibling_projections`` are fused into one
    product per group (:mod:`.fused_linear`; not counted again); where this
    machine's routes say ``bf16_blocked``, they become :class:`BlockedLinear`
    instead (not named by ``skip``, not shared or tied), and the groups a module
    names in ``blocked_siblings`` one blocked product each (:class:`BlockedRows`).
    Nothing happens (0) where the torch build cannot run packed layers;
    packing twice packs nothing new. ``skip`` keeps named layers plain
    ``nn.Linear`` (a mixture's experts, which see a row or two per call,
    gain nothing from routing).
    """
    if min_elements is None:
        min_elements = DEFAULT_MIN_ELEMENTS
    # this machine's fastest routes (measured once, then cached; see cpu_kernel_choice)
    use_routes(kernel_choice(onednn=packing_available()))
    rows = _route_single_rows(module)
    if _routes.bf16_blocked and blocking_available():
        # Blocked weights are copies: a dense fusion first would keep the fused
        # dense weight alive beside them (the members' weights are its views), so
        # the groups worth one product are blocked as one instead (BlockedRows).
        _block_sibling_groups(module, skip)
        _block_row_layers(module, skip)
    else:
        # Routed bf16 projections that read one input become one product each
        # (q/k/v, gate/up; see fused_linear).
        fuse_sibling_projections(module, kinds=(RowLinear,))
    if not packing_available():
        return rows
    targets = [
        (parent, name)
        for prefix, parent in module.named_modules()
        for name, child in parent.named_children()
        if not (skip and skip(f"{prefix}.{name}" if prefix else name))
        and type(child) is nn.Linear
        and child.weight.dtype == torch.float32
        and child.weight.device.type == "cpu"
        and child.weight.numel() >= min_elements
    ]
    # One layer at a time, holding no reference to the dense ones already
    # replaced, so that packing needs one layer's worth of extra memory. A layer
    # shared by several parents is packed once and stays shared.
    packed: dict[int, PackedLinear] = {}
    for parent, name in targets:
        child = getattr(parent, name)
        if id(child) not in packed:
            packed[id(child)] = PackedLinear(child)
        setattr(parent, name, packed[id(child)])
    return len(packed) + rows


def block_as_one(parent: nn.Module, names: Sequence[str]) -> BlockedLinear:
    """Replace ``parent``'s layers ``names`` (bf16 CPU linear layers over one input, all
    with a bias or all without) by windows of one blocked product (:class:`BlockedRows`),
    which :func:`~omni_core.engine.fused_linear.project` computes in one call; the product.

    The caller checks that the layers may be copied (not shared, tied or mapped).
    """
    layers = [getattr(parent, name) for name in names]
    with torch.no_grad():
        weight = torch.cat([layer.weight.detach() for layer in layers])
        bias = None
        if layers[0].bias is not None:
            bias = torch.cat([layer.bias.detach() for layer in layers])
        product = BlockedLinear.of(weight, bias)
    del weight
    members, start = [], 0
    for name, layer in zip(names, layers, strict=True):
        bias = None if layer.bias is None else nn.Parameter(layer.bias.detach(), False)
        member = BlockedRows(product, start, start + layer.out_features, bias)
        setattr(parent, name, member)
        members.append(member)
        start += layer.out_features
    share_product(members, product)
    return product


def _block_sibling_groups(module: nn.Module, skip: Callable[[str], bool] | None) -> int:
    """Block each group that a submodule names in ``blocked_siblings`` as one product; count them.

    Every member must be a :class:`RowLinear` that :func:`_block_row_layers`
    would block (not named by ``skip``, not shared, tied or a window), over
    the same input, all with a bias or all without; otherwise its members
    are blocked one by one. One group is copied at a time.
    """
    holders = _holders(module)
    fused = 0
    for prefix, parent, names in named_groups(module, "blocked_siblings"):
        layers = [getattr(parent, name) for name in names]
        full_names = [f"{prefix}.{name}" if prefix else name for name in names]
        if (
            len(layers) < 2
            or len(set(map(id, layers))) < len(layers)
            or any(type(layer) is not RowLinear for layer in layers)
            or (skip and any(skip(name) for name in full_names))
            or len({layer.in_features for layer in layers}) > 1
            or len({layer.bias is None for layer in layers}) > 1
            or not all(_blockable(layer.weight, holders) for layer in layers)
        ):
            continue
        block_as_one(parent, names)
        del layers
        fused += 1
    if fused:
        return_freed_memory()
    return fused


def _holders(module: nn.Module) -> dict[int, int]:
    """How many modules hold each parameter (a layer reached through two parents is
    one module, counted once)."""
    holders: dict[int, int] = {}
    for sub in module.modules():
        for param in sub._parameters.values():
            if param is not None:
                holders[id(param)] = holders.get(id(param), 0) + 1
    return holders


def _block_row_layers(module: nn.Module, skip: Callable[[str], bool] | None) -> int:
    """Make each :class:`RowLinear` under ``module`` a :class:`BlockedLinear`; count them.

    Not a layer ``skip`` names (a mixture's experts, which stack their dense
    weights), nor one whose weight another module holds too (a head tied to
    an embedding), is a window of a larger tensor, or is shared with other
    processes: blocking copies, and each of those would then be held twice.
    """
    holders = _holders(module)
    targets = [
        (parent, name)
        for prefix, parent in module.named_modules()
        for name, child in parent.named_children()
        if type(child) is RowLinear
        and not (skip and skip(f"{prefix}.{name}" if prefix else name))
        and _blockable(child.weight, holders)
    ]
    blocked: dict[int, BlockedLinear] = {}
    for parent, name in targets:  # one layer at a time: one layer's worth of extra memory
        child = getattr(parent, name)
        if id(child) not in blocked:
            blocked[id(child)] = BlockedLinear(child)
        setattr(parent, name, blocked[id(child)])
        del child
    if blocked:
        return_freed_memory()
    return len(blocked)


def _blockable(weight: torch.Tensor, holders: dict[int, int]) -> bool:
    whole = weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
    return (
        holders.get(id(weight), 0) <= 1
        and whole
        and not weight.is_shared()
        and not mapped.is_mapped(weight)
    )


def _route_single_rows(module: nn.Module) -> int:
    """Make every CPU bf16 ``nn.Linear`` a :class:`RowLinear`; count them.

    ``skip`` does not apply: it keeps layers from oneDNN packing, where
    small-row layers lose, while the single-row route is never slower.
    """
    layers = [
        m
        for m in module.modules()
        if type(m) is nn.Linear
        and m.weight.dtype == torch.bfloat16
        and m.weight.device.type == "cpu"
        and m.weight.numel() >= ROW_MIN_ELEMENTS
    ]
    for layer in layers:
        layer.__class__ = RowLinear
    return len(layers)
