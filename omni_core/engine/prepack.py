"""Compiled CPU steps over inductor's AMX GEMM template (``engine.cpu_weight_prepack``).

Why: torch's bf16 matrix-vector kernel reads a weight held in the
last-level cache at about 28-30 GB/s here (2 threads), while inductor's C++
GEMM template (its AMX micro-kernel over a weight packed into blocked VNNI
layout) reads it at 35-40 GB/s, at 1 and at 8 rows. The template only
takes weights it can pack while compiling, so the step is compiled with
*freezing*: every parameter becomes a constant of the graph and each
product's weight is packed into it. Measured on Qwen3-TTS 0.6B's code
predictor (161 MB of bf16 weights, run 15 times per frame), one frame at
batch 1: 110.5 ms compiled as usual, 86.7 ms prepacked.

What it costs, and so where it applies:

* memory: each compiled graph (bucket x step length x span) holds its own
  packed copy of the decoder's weights; inductor shares nothing between
  graphs. Measured: 4 buckets x 2 step lengths of that code predictor added
  1.7 GB of RSS.
* the gain is the cache's: a weight streamed from memory reads no faster
  packed (the Qwen3-TTS talker's 880 MB step: 46.5 ms either way). So a
  decoder is prepacked only when its weights fit the last-level cache, which
  also bounds the copies' cost.
* start-up: each product's kernel is chosen by timing the template against
  ATen's while compiling (about 12 s per graph of that code predictor).
* the weights are frozen into the graphs at start-up: a decoder's weights
  must not change afterwards (omni never does so once a stage is ready).

int8 weights (``factory.quantization = "int8"``) are the exception to the
cache rule: torch's int8 kernel (``aten._weight_int8pack_mm``) is bound by
arithmetic, not by reading, and the template's packed int8 kernel is faster
from memory too (measured here, 2 threads, SwiGLU blocks of 1024x6144 and
3072x1024 int8 weights: from memory, 755 MB at one row, 10.6 -> 15.7 GB/s;
in cache at 8 rows 4.5 -> 14.8 GB/s). So an int8 decoder is prepacked
whatever its size, and pays one packed copy per graph for it.

Only bf16 activations on a CPU with AMX tiles, where it was measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_cache import last_level_cache_bytes
from .cpu_linear import RowLinear
from .inductor_options import step_options

#: Inductor options of a prepacked step: GEMMs chosen among the C++ template
#: and ATen by timing (ATen stays a choice, so that a product the template
#: cannot take still compiles).
PREPACK_OPTIONS = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


def amx_available() -> bool:
    """Whether this CPU has AMX tiles (the template's fast bf16 micro-kernel)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe and probe())


def step_module(forward: Callable[..., Any]) -> nn.Module | None:
    """The module that is the step, or whose method it is (``model.step``); None for a function."""
    if isinstance(forward, nn.Module):
        return forward
    owner = getattr(forward, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def product_bytes(module: nn.Module) -> int:
    """Bytes of the weights ``module``'s products read: what is packed, and what must fit.

    Linear layers' weights (int8 ones with their scales), each tensor counted
    once; embeddings and norms are neither packed nor streamed whole by a
    step (a step reads an embedding's few rows), so they count for nothing.
    """
    from .quantize import Int8Linear
    from .w8a8 import W8A8Linear, W8A8Rows

    seen: dict[int, int] = {}
    for layer in module.modules():
        if isinstance(layer, Int8Linear):
            tensors = [layer.qweight, layer.scales]
        elif isinstance(layer, (W8A8Linear, W8A8Rows)):  # oneDNN's int8 layout, not templated
            product = layer.product if isinstance(layer, W8A8Rows) else layer
            tensors = [product.packed, product.scales]
        elif isinstance(layer, nn.Linear):
            tensors = [layer.weight]
        else:
            continue
        for tensor in tensors:
            seen[id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


def has_int8_layers(module: nn.Module) -> bool:
    """Whether ``module`` holds int8 weight-only layers (``factory.quantization``)."""
    from .quantize import Int8Linear

    return any(isinstance(m, Int8Linear) for m in module.modules())


def refusal(forward: Callable[..., Any], dtype: torch.dtype, device: torch.device) -> str | None:
    """Why the step ``forward`` is not prepacked, or None when it is (see the module docstring)."""
    if device.type != "cpu":
        return f"its weights are on {device.type}, not the CPU"
    if dtype != torch.bfloat16:
        return f"its weights are {str(dtype).removeprefix('torch.')}, not bfloat16"
    if not amx_available():
        return "this CPU has no AMX tiles"
    module = step_module(forward)
    if module is None:
        return "its step is neither a module nor a module's method, so its weights are unknown"
    if has_int8_layers(module):
        return None  # the template gains from memory too (see the module docstring)
    cache = last_level_cache_bytes()
    if cache is None:
        return "the system does not say how large the CPU's last-level cache is"
    size = product_bytes(module)
    if size > cache:
        return (
            f"its weights ({size / 1e6:.0f} MB) do not fit the last-level cache "
            f"({cache / 1e6:.0f} MB), where packing gains nothing"
        )
    return None


class TemplateRowLinear(RowLinear):
    """A :class:`RowLinear` whose compiled product is a plain linear, for the template to take.

    Eager calls keep RowLinear's kernels; inside a compiled step the product
    must be ATen's linear (not RowLinear's opaque operator) for inductor to
    lower it to its GEMM template.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return F.linear(x, self._parameters["weight"], self._parameters["bias"])
        return super().forward(x)


def route_to_template(module: nn.Module) -> int:
    """Make the :class:`RowLinear` layers under ``module`` (fused products too) template ones."""
    from .fused_linear import _FUSION

    layers = list(module.modules())
    layers += [m.__dict__[_FUSION].product for m in layers if _FUSION in m.__dict__]
    count = 0
    for layer in layers:
        if type(layer) is RowLinear:
            layer.__class__ = TemplateRowLinear
            count += 1
    return count


def compile_prepacked(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` compiled with its weights frozen and packed into the graph.

    Freezing is inductor configuration read when a graph compiles, not an
    option ``torch.compile`` passes through, so every call runs under it:
    a graph compiled later (a recompile) is packed the same way.
    """
    compiled = torch.compile(step, dynamic=False, options=step_options(**PREPACK_OPTIONS))

    def run(*args: Any) -> Any:
        with _freezing():
            return compiled(*args)

    return run


@contextlib.contextmanager
def _freezing() -> Iterator[None]:
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True):
        yield
