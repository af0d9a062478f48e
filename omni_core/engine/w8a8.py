"""int8 weights and int8 activations (``factory.quantization = "w8a8_int8"``) on oneDNN's kernel.

Why a second int8 scheme: weight-only int8 (:mod:`.quantize`) halves the
bytes a step reads, but torch's kernel for it dequantises every weight to
float and multiplies in float, so from two rows on it is bound by float
arithmetic, and on a CPU without AMX a batch of eight rows runs no faster
in bf16 than the machine's bf16 dot products allow (MOSS-TTS's layer shapes,
2 threads, AVX512-BF16: 225-239 GFLOP/s). Quantising each row of the
activations to int8 too puts the product on the CPU's integer dot product
(VNNI: four int8 multiply-adds per lane where bf16 has two), and oneDNN's
``qlinear`` kernel reads the int8 weight in its own blocked layout. Measured
here (2 threads, MOSS-TTS's fused q/k/v, o, fused gate/up and down of one
layer, random weights, best of three): 8.0 against 15.6 ms at one row, 8.9
against 16.5 at eight, 19.3 against 33.9 at 32, against the same weights as
bf16 blocked products (``cpu_linear.BlockedLinear``;
``benchmarks/bench_cpu_linear.py`` times both on Qwen3-TTS's shapes). SGLang
names the same scheme ``w8a8_int8``.

What it computes: weights symmetric per output channel (``max|w| / 127``,
rounded to the nearest step), as the weight-only scheme; activations
symmetric *per row* (``max|x| / 127``), computed at every call. oneDNN takes
one activation scale per call, so each row is first divided by its own
scale, the product taken with scale 1, and each output row multiplied back:
the same numbers as a per-row scale, and a row's result never depends on the
other rows of its batch (another request's outlier does not coarsen this
one's steps; tests check it bit for bit). The error is the activations'
rounding (half a step of ``max|x| / 127`` per element) on top of the
weights': about 1 % of a product's norm on random data, more where a few
channels carry outliers (the release checkpoints are not smoothed for it);
it is opt-in, as it is in SGLang.

Where it runs: the CPU, float32 or bfloat16 activations (the product's
output comes back in the layer's dtype). Not on CUDA (refused: torch's
``_int_mm`` route is not built here). Imported only in stage processes.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .graph_handles import Handles, number_tensor


def w8a8_problem() -> str | None:
    """Why this torch build cannot run int8 products on this CPU (checked once), or None."""
    return _w8a8_problem()


@functools.cache
def _w8a8_problem() -> str | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        # oneDNN's int8 kernels are x86's (VNNI / AVX2); elsewhere its reference kernel runs
        machine = platform.machine()
        return f"oneDNN's int8 linear kernel is built for x86-64 CPUs, and this is {machine}"
    ops = torch.ops.onednn
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if not (hasattr(ops, "qlinear_prepack") and hasattr(ops, "qlinear_pointwise")):
        return "this torch build lacks oneDNN's int8 linear operators (onednn::qlinear_*)"
    try:
        weight = torch.linspace(-1.0, 1.0, 24).reshape(3, 8)
        x = torch.linspace(-0.5, 1.5, 16).reshape(2, 8)
        got = W8A8Linear(weight, None)(x)
    except (RuntimeError, NotImplementedError) as exc:  # a build or CPU without the kernel
        return f"oneDNN's int8 linear kernel failed on this CPU: {exc}"
    if not torch.allclose(got, x @ weight.T, atol=5e-2, rtol=5e-2):
        return "oneDNN's int8 linear kernel gave wrong results on this CPU"
    return None


#: The activations' zero point: the rows go to oneDNN as unsigned bytes, ``q + 128``. Its
#: VNNI kernel multiplies unsigned by signed bytes; signed activations (zero point 0) run
#: oneDNN's reference kernel instead, a thousand times slower (3072x1024, one row: 67 ms
#: against 65 us).
ZERO_POINT = 128

#: oneDNN's int8 linear operator, its overload resolved once (None in a build without it:
#: :func:`w8a8_problem` says so before any layer is built), and its trailing arguments
#: (no post-op: the rows' scales are applied after it, in the layer's dtype).
_QLINEAR = getattr(getattr(torch.ops.onednn, "qlinear_pointwise", None), "default", None)
_NO_POST_OP = ("none", [], "")


def quantize_rows(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``flat`` ``[rows, in]`` as unsigned bytes (``q + 128``) and each row's scale ``[rows, 1]``.

    In float32 whatever ``flat``'s dtype: a bf16 quotient ``x * 127 / s``
    would round to bf16's eight bits before the rounding to an integer step.
    A row of zeros gets a tiny scale and quantises to zeros.
    """
    values = flat.float()
    scales = values.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30).div_(127.0)
    return values.div(scales).round_().add_(ZERO_POINT).to(torch.uint8), scales


class W8A8Linear(nn.Module):
    """``nn.Linear`` with int8 weights for oneDNN's int8 kernel; activations quantised per row.

    Same call and shapes as the layer it replaces; the output is in the
    input's dtype. ``weight`` gives a dequantised copy, for code that
    inspects weights (never the hot path).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w32 = weight.detach().float()
        scales = w32.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w32 / scales[:, None]).clamp_(-127, 127).to(torch.int8)
        del w32
        # oneDNN's own layout for its int8 kernel (opaque: neither state_dict nor .to()
        # see it, as the blocked bf16 weights); the row hint picks the decode-sized layout.
        self.packed = torch.ops.onednn.qlinear_prepack(q, [8, self.in_features])
        self.register_buffer("scales", scales)
        self.register_buffer("zeros", torch.zeros(self.out_features, dtype=torch.long))
        held = None if bias is None else bias.detach()
        self.bias = None if held is None else nn.Parameter(held, requires_grad=False)
        self._arguments: tuple | None = None  # oneDNN's, built at the first product
        number_tensor(self, _LAYERS.add(self))  # what a compiled step names it by

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight ``[out, in]`` (float32)."""
        return self.packed.to_dense().t().float() * self.scales[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise TypeError(f"a w8a8_int8 linear layer takes CPU inputs, got {x.device}")
        if torch.compiler.is_compiling():
            return self.traced_product(x, self.bias)
        return self.product(x, self.bias)

    def traced_product(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """:meth:`product` as a compiled step writes it: the rows quantised in the graph.

        Why apart: the quantisation is a dozen small operators per product
        (abs, amax, a division, a rounding, a cast...). Eager, each costs a
        dispatch, a few microseconds, and a one-row decode step makes
        hundreds of products (Qwen3-TTS: 412 a frame). Traced, inductor
        fuses them, with the norm before them, into one loop; only oneDNN's
        kernel, which takes the opaque weight, stays an operator of ours
        (``omni::w8a8_product``), named by the layer's number.
        """
        shape = x.shape
        quantized, row_scales = quantize_rows(x.reshape(-1, self.in_features))
        # the rows' scales applied in the graph, fused with what reads the product next
        out = torch.ops.omni.w8a8_product(quantized, self.handle, self.out_features, x.dtype)
        out = (out * row_scales).to(x.dtype)  # as mul_ rounds in eager: once, to x's dtype
        if bias is not None:
            out = out + bias
        return out.reshape(*shape[:-1], self.out_features)

    def product(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] == 0:
            return x.new_empty((*shape[:-1], self.out_features))
        out = self.quantized_product(*quantize_rows(flat), x.dtype)
        if bias is not None:
            out = out.add_(bias)
        return out.reshape(*shape[:-1], self.out_features)

    def quantized_product(
        self, quantized: torch.Tensor, row_scales: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """The product of rows :func:`quantize_rows` made, ``[rows, out]`` in ``dtype``.

        For callers that quantise rows once for several layers (a mixture's
        experts, :mod:`omni_qwen3_omni.thinker.w8a8_experts`): each row's
        result is the one :meth:`forward` gives it, bit for bit.
        """
        # the product of int8 rows (scale 1) in the input's dtype, then each row's scale:
        # in bf16 that rounds twice (~0.4 % each), well inside the quantisation's ~1 %
        return _QLINEAR(quantized, *self.onednn_arguments(), dtype, *_NO_POST_OP).mul_(row_scales)

    def onednn_arguments(self) -> tuple[Any, ...]:
        """oneDNN's arguments between the rows and the output dtype: the rows' scale 1 and
        zero point, the packed weight with its scales and zero points, no bias, the output's
        scale 1 and zero point 0.

        Built once and kept (rebuilt where the buffers were replaced, as ``.to()`` does):
        a decode step makes hundreds of products (Qwen3-TTS: 412 a frame), and building
        the tuple and resolving the operator's overload each call cost 3.4 us of a
        170 us product (one row, Qwen3-TTS's four layer shapes, alternated 30 times).
        """
        packed, scales, zeros = self.packed, self._buffers["scales"], self._buffers["zeros"]
        held = self._arguments
        if held is None or not (held[2] is packed and held[3] is scales and held[4] is zeros):
            held = (1.0, ZERO_POINT, packed, scales, zeros, None, 1.0, 0)
            self._arguments = held
        return held

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            "int8 weights per channel, int8 activations per row (oneDNN)"
        )


class W8A8Rows(nn.Module):
    """One of sibling projections quantised as one product: its outputs are rows of it.

    As :class:`~omni_core.engine.cpu_linear.BlockedRows`: q/k/v, or gate/up,
    read the same input, so one product quantises that input once and reads
    one tall weight; :func:`~omni_core.engine.fused_linear.project` computes
    the group in one call. Called alone, a member computes the whole product
    and keeps its rows.
    """

    def __init__(self, product: W8A8Linear, start: int, stop: int, bias: nn.Parameter | None):
        super().__init__()
        self.in_features, self.out_features = product.in_features, stop - start
        self.__dict__["product"] = product  # not a submodule: listed once, by no member
        self.start, self.stop = start, stop
        self.bias = bias

    @property
    def weight(self) -> torch.Tensor:
        return self.product.weight[self.start : self.stop]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.product(x)[..., self.start : self.stop]
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rows {self.start}:{self.stop} of a w8a8_int8 product of {self.product.out_features}"
        )


def fused_w8a8(
    weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]
) -> W8A8Linear:
    """One :class:`W8A8Linear` over the concatenated ``weights`` (and biases, all or none)."""
    with torch.no_grad():
        weight = torch.cat([w.detach().float() for w in weights])
        bias = None
        if biases[0] is not None:
            bias = torch.cat([b.detach() for b in biases if b is not None])
        return W8A8Linear(weight, bias)


#: Layers by the number a compiled step names them with (weak: a freed layer leaves).
_LAYERS = Handles()


def _w8a8_product(
    quantized: torch.Tensor, weight: torch.Tensor, out_features: int, dtype: torch.dtype
) -> torch.Tensor:
    return _QLINEAR(quantized, *_LAYERS[int(weight)].onednn_arguments(), dtype, *_NO_POST_OP)


def _w8a8_product_shape(
    quantized: torch.Tensor, weight: torch.Tensor, out_features: int, dtype: torch.dtype
) -> torch.Tensor:
    return quantized.new_empty((quantized.shape[0], out_features), dtype=dtype)


# A compiled decode step cannot take oneDNN's opaque weight as an input (as the blocked bf16
# weights, cpu_blocked_weight.py): it calls this operator with the layer's number instead.
_LIBRARY = torch.library.Library("omni", "FRAGMENT")
_LIBRARY.define(
    "w8a8_product(Tensor quantized, Tensor weight, int out_features, ScalarType dtype) -> Tensor"
)
_LIBRARY.impl("w8a8_product", _w8a8_product, "CPU")
torch.library.register_fake("omni::w8a8_product", _w8a8_product_shape, lib=_LIBRARY)
