"""A float16 copy of each blocked bf16 weight, for fbgemm's one- and two-row kernel.

``factory.fp16_row_weights = true`` (CPU, bf16 stages). Why: a decode step of
one or two requests multiplies every weight by one or two rows, and there
fbgemm's float16 kernel (``quantized::linear_dynamic_fp16``, in torch's x86
builds) streams a weight faster than oneDNN's blocked bf16 product, the
stages' bf16 route: 1.24-1.52x per product on a 2-core AMD EPYC
(``benchmarks/bench_cpu_kernel_survey.py``); a whole Qwen3-TTS 0.6B frame's
428 products took 109-125 ms against 149-154 on two threads, and 114-119
against 181-184 on one. From four rows on it loses (0.75-0.84x at eight,
half the speed at a prefill's hundreds), and its packed weight cannot be
turned back into bf16 quickly (34 ms for one 1536x2048 expert), so the layer
keeps its blocked weight for those calls and holds the copy beside it: the
linear layers' memory twice over, which the plan counts
(``omni_core.plan.estimates``). Opt-in for that reason.

The numbers stay bf16's: every bf16 value of magnitude 6.1e-5 to 65504
(float16's normal range) is a float16 exactly, and smaller ones keep
float16's subnormal step (an absolute error of at most 3e-8); inputs enter
as float32 (exact), products accumulate in float32 as oneDNN's bf16 kernel
does, and the output is rounded once to bf16: the same products up to
summation order and the last bits of the tiniest weights. A weight beyond
float16's range keeps no copy. Imported only in stage processes.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

log = logging.getLogger(__name__)

#: Calls of at most this many rows take the float16 copy; more take the blocked weight.
ROW_COPY_MAX_ROWS = 2
FLOAT16_MAX = 65504.0


def row_copies_available() -> bool:
    """Whether this torch build carries fbgemm's float16 linear kernel (x86 builds do)."""
    quantized = torch.ops.quantized
    return (
        "fbgemm" in torch.backends.quantized.supported_engines
        and hasattr(quantized, "linear_prepack_fp16")
        and hasattr(quantized, "linear_dynamic_fp16")
    )


def pack_float16(weight: torch.Tensor) -> torch.ScriptObject | None:
    """``weight`` ``[out, in]`` (bf16) packed as float16 for fbgemm, or None where a value
    lies beyond float16's range."""
    weight = weight.detach()
    if weight.numel() and float(weight.abs().max()) >= FLOAT16_MAX:
        return None
    return torch.ops.quantized.linear_prepack_fp16(weight.float(), None)


def row_copy_product(
    x: torch.Tensor, copy: torch.ScriptObject, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for bf16 ``x`` through the float16 copy: bf16 out."""
    flat = x.reshape(-1, x.shape[-1]).float()
    out = row_copy_float(flat, copy).to(torch.bfloat16)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def row_copy_float(x: torch.Tensor, copy: torch.ScriptObject) -> torch.Tensor:
    """The product of float32 rows ``x`` ``[rows, in]`` through the copy, float32 out (for
    callers that convert many products' rows at once, :mod:`omni_qwen3_omni`'s experts)."""
    return torch.ops.quantized.linear_dynamic_fp16(x, copy)


def takes_row_copy(layer: nn.Module, x: torch.Tensor) -> torch.ScriptObject | None:
    """The float16 copy ``layer`` holds if this call's rows should take it, else None."""
    if not x.shape[-1]:
        return None
    return row_copy_for(layer, x.numel() // x.shape[-1])


def row_copy_for(layer: nn.Module, rows: int) -> torch.ScriptObject | None:
    """The float16 copy ``layer`` holds if a call of ``rows`` rows should take it."""
    copy = layer.__dict__.get("row_copy")
    return copy if copy is not None and 0 < rows <= ROW_COPY_MAX_ROWS else None


def add_row_copies(module: nn.Module) -> int:
    """Give every blocked bf16 product under ``module`` a float16 copy; how many hold one.

    Only :class:`~omni_core.engine.cpu_linear.BlockedLinear` products (a
    sibling group's one product counted once): the
    weights this machine's routes block for oneDNN (``cpu_kernel_choice``),
    which are already the stage's own copies (never a mapped, shared weight).
    Idempotent.
    """
    # A group's members (BlockedRows) hold their product outside the module tree. Known
    # by their oneDNN weight, not by class: cpu_linear imports this module's kernel.
    products = {
        id(found): found
        for layer in module.modules()
        for found in (layer.__dict__.get("product", layer),)
        if _blocked(found)
    }
    missing = [layer for layer in products.values() if "row_copy" not in layer.__dict__]
    # fbgemm's packing is most of a stage's extra start-up (about 7 ms per million
    # weights on one core, the copy out of the blocked layout 3 more) and releases the
    # GIL: the layers are packed on as many threads as the stage's torch threads
    workers = max(1, min(torch.get_num_threads(), len(missing)))
    with ThreadPoolExecutor(workers, thread_name_prefix="row-copy") as pool:
        copies = list(pool.map(lambda layer: pack_float16(layer.packed.to_dense()), missing))
    for layer, copy in zip(missing, copies, strict=True):
        if copy is not None:
            layer.__dict__["row_copy"] = copy
    return sum(layer.__dict__.get("row_copy") is not None for layer in products.values())


def _blocked(layer: object) -> bool:
    """Whether ``layer`` computes through a weight in oneDNN's blocked layout
    (``cpu_linear.BlockedLinear``: the only layer whose ``packed`` is a oneDNN tensor)."""
    packed = getattr(layer, "packed", None)
    return isinstance(packed, torch.Tensor) and packed.is_mkldnn


def apply_row_copies(module: nn.Module, enabled: bool, *, stage: str) -> int:
    """A stage factory's one call: refuse what cannot run here (ValueError), else add them.

    Refused: a torch without fbgemm, and weights that are not bf16 on the CPU.
    A model with no blocked layer (this machine's routes keep bf16 weights
    dense, or ``pack_weights`` is off) gets a warning in the stage's log: the
    setting does nothing there.
    """
    if not enabled:
        return 0
    where = f"stage {stage!r}: factory.fp16_row_weights = true"
    if not row_copies_available():
        raise ValueError(
            f"{where}: this torch build has no fbgemm float16 kernel "
            "(quantized::linear_dynamic_fp16; x86 builds have it): remove the setting"
        )
    param = next(module.parameters(), None)
    if param is not None and (param.dtype != torch.bfloat16 or param.device.type != "cpu"):
        raise ValueError(
            f"{where}: the copies are of bf16 CPU weights, and this stage's are "
            f"{str(param.dtype).removeprefix('torch.')} on {param.device.type}: "
            'set factory.dtype = "bfloat16" on a CPU stage, or remove the setting'
        )
    held = add_row_copies(module)
    if held:
        log.info("stage %r: float16 copies of %d blocked linear products", stage, held)
    else:
        # not an error: the deployment runs as without the setting, on another machine's
        # routes it may take effect (and a tiny model's layers are never blocked)
        log.warning(
            "%s: no linear layer here is blocked for oneDNN (this machine's kernel routes "
            "keep bf16 weights dense, the layers are small, or factory.pack_weights is false), "
            "and only blocked layers take a copy: the setting does nothing here",
            where,
        )
    return held
