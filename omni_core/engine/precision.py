"""Which dtype a stage keeps its weights in: ``factory.dtype`` resolved, once, for everyone.

Why: decoding is bound by how fast weights stream from memory, so the dtype
that reads fewest bytes wins, but only where the device also *computes* in
it quickly. A bfloat16 matmul on a CPU without AMX or AVX512-BF16 is
emulated and slower than float32; float16 on a CPU without AVX512-FP16 or
AMX-FP16 is slower still. The rule for ``auto`` (or no value):

- the checkpoint's own dtype (``torch_dtype`` / ``dtype`` in its
  ``config.json``; without one, the release's dtype the plugin names:
  bfloat16 for every family shipped here) where the device computes that
  dtype fast: CUDA GPUs (bfloat16 from compute capability 8.0), CPUs with
  AMX-BF16 or AVX512-BF16 for bfloat16;
- float32 otherwise.

An explicit choice is kept, but refused where it cannot run well: float16 on
a CPU without fast float16, bfloat16 on a GPU known to lack it. The planner
(``omni plan``, torch-free) and the stage processes (:func:`torch_dtype`)
call the same :func:`decide`, so what the plan prints is what the process
loads.

The CPU's flags come from ``/proc/cpuinfo``; the environment variable
``OMNI_CPU_FLAGS`` (space-separated flag names, possibly empty) replaces
them: tests set it so that no result depends on the machine they run on.
Nothing here imports torch at module level.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Each factory.quantization's layers and the CPU kernel they run on (none on CUDA yet):
#: the words of the plan's refusal and of the stage's, one source.
QUANTIZED_KERNELS = {
    "int8": ("int8 weight-only layers", "torch's CPU kernel (aten._weight_int8pack_mm)"),
    "w8a8_int8": ("w8a8_int8 layers", "oneDNN's CPU int8 kernel (onednn::qlinear_pointwise)"),
}

FLAGS_VAR = "OMNI_CPU_FLAGS"
CPUINFO = "/proc/cpuinfo"

# Accepted spellings (the schema's DType) -> canonical names.
DTYPE_NAMES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

# CPU flags (as /proc/cpuinfo spells them) that make a dtype fast, first one found is named.
FAST_CPU_FLAGS: dict[str, tuple[str, ...]] = {
    "bfloat16": ("amx_bf16", "avx512_bf16"),
    "float16": ("amx_fp16", "avx512_fp16"),
}
FLAG_NAMES = {
    "amx_bf16": "AMX",
    "avx512_bf16": "AVX512-BF16",
    "amx_fp16": "AMX-FP16",
    "avx512_fp16": "AVX512-FP16",
}
# GPU names (NVML's) known to predate bfloat16 (compute capability < 8.0).
NO_BF16_GPUS = ("V100", "T4", "P100", "P40", "P4", "K80", "M60", "TITAN V", "RTX 20", "GTX")


class PrecisionError(ValueError):
    """A dtype the device cannot run well; ``hint`` says how to fix it."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.message, self.hint = message, hint


@dataclass(frozen=True)
class Precision:
    """The dtype a stage's weights are kept in, and why (printed by ``omni plan``)."""

    dtype: str  # canonical: float32, bfloat16 or float16
    reason: str

    def describe(self) -> str:
        return f"{self.dtype} ({self.reason})"

    def to_dict(self) -> dict[str, str]:
        return {"dtype": self.dtype, "reason": self.reason}


def canonical(name: Any, *, what: str = "dtype") -> str:
    """``name`` (``bf16``, ``torch.bfloat16``, ``BFloat16``) as float32 / bfloat16 / float16."""
    key = str(name).lower().removeprefix("torch.")
    if key not in DTYPE_NAMES:
        raise PrecisionError(
            f"{what}: {name!r} is not a dtype name",
            hint=f"use one of auto, {', '.join(DTYPE_NAMES)}",
        )
    return DTYPE_NAMES[key]


def read_cpu_flags(cpuinfo: str = CPUINFO) -> frozenset[str]:
    """The ``flags`` of the first processor in ``cpuinfo`` (empty where there is none)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def _machine_flags() -> frozenset[str]:
    return read_cpu_flags()


def cpu_flags(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """This CPU's flags: ``OMNI_CPU_FLAGS`` when set (the seam tests use), else /proc/cpuinfo."""
    environ = os.environ if environ is None else environ
    override = environ.get(FLAGS_VAR)
    if override is not None:
        return frozenset(override.replace(",", " ").split())
    return _machine_flags()


def fast_flag(dtype: str, flags: frozenset[str]) -> str | None:
    """The CPU flag that makes ``dtype`` fast here, if any (float32 needs none)."""
    return next((f for f in FAST_CPU_FLAGS.get(dtype, ()) if f in flags), None)


def checkpoint_dtype(config: Mapping[str, Any] | None, release: str) -> tuple[str, str]:
    """(dtype, where it came from) for a checkpoint's ``config.json`` (``None``: not local).

    ``torch_dtype`` (transformers < 5) or ``dtype``; without either, ``release``.
    """
    for key in ("torch_dtype", "dtype"):
        value = (config or {}).get(key)
        if isinstance(value, str) and value.lower().removeprefix("torch.") in DTYPE_NAMES:
            return canonical(value), "checkpoint"
    return canonical(release), "release"


def decide(
    requested: str | None,
    *,
    device: str,
    checkpoint: str = "bfloat16",
    checkpoint_source: str = "checkpoint",
    flags: frozenset[str] | None = None,
    gpu_name: str | None = None,
    gpu_bf16: bool | None = None,
    what: str = "factory.dtype",
) -> Precision:
    """The dtype for weights on ``device`` (``cpu``, ``cuda``, ``cuda:1``), and why.

    ``requested``: the stage's ``factory.dtype`` (None or ``auto`` chooses);
    ``checkpoint``: the weights' own dtype, from ``checkpoint_source``
    (``checkpoint`` when its config said, ``release`` when assumed);
    ``flags``: the CPU's (default :func:`cpu_flags`); ``gpu_name``: NVML's
    name of the GPU when known; ``gpu_bf16``: whether it computes bfloat16,
    when asked of torch (else judged by the name). Raises :class:`PrecisionError` for a choice
    the device cannot run well.
    """
    kind = str(device).split(":", 1)[0]
    stored = canonical(checkpoint, what=f"{what} (checkpoint dtype)")
    origin = f"{checkpoint_source} {SHORT[stored]}"
    if kind == "cpu":
        flags = cpu_flags() if flags is None else flags
    no_bf16 = gpu_bf16 is False or (gpu_bf16 is None and _lacks_bf16(gpu_name))
    gpu = gpu_name or "this GPU"
    if requested is None or str(requested).lower() == "auto":
        if stored == "float32":
            return Precision("float32", f"auto: {origin}")
        if kind == "cpu":
            flag = fast_flag(stored, flags or frozenset())
            if flag is None:
                wanted = "/".join(FLAG_NAMES[f] for f in FAST_CPU_FLAGS[stored])
                return Precision(
                    "float32", f"auto: {origin}, but this CPU has no {wanted}: float32 is faster"
                )
            return Precision(stored, f"auto: {origin}, CPU has {FLAG_NAMES[flag]}")
        if stored == "bfloat16" and no_bf16:
            return Precision("float16", f"auto: {origin}, but {gpu} has no bfloat16")
        return Precision(stored, f"auto: {origin}, on the GPU")
    chosen = canonical(requested, what=what)
    if kind == "cpu" and chosen != "float32":
        flag = fast_flag(chosen, flags or frozenset())
        if flag is None and chosen == "float16":
            raise PrecisionError(
                f"{what} = {requested!r} on the CPU: this CPU has no AVX512-FP16 or AMX-FP16, "
                "so float16 would run emulated, many times slower than float32",
                hint=f'set {what} = "auto" (or "bfloat16" / "float32")',
            )
        if flag is None:
            return Precision(chosen, "set; this CPU has no AMX/AVX512-BF16: slower than float32")
        return Precision(chosen, f"set; CPU has {FLAG_NAMES[flag]}")
    if kind != "cpu" and chosen == "bfloat16" and no_bf16:
        raise PrecisionError(
            f"{what} = {requested!r} on {gpu}: it has no bfloat16 (compute capability below 8.0)",
            hint=f'set {what} = "float16" (or "auto")',
        )
    return Precision(chosen, "set")


def _lacks_bf16(gpu_name: str | None) -> bool:
    return bool(gpu_name) and any(tag in str(gpu_name).upper() for tag in NO_BF16_GPUS)


def torch_dtype(
    requested: Any,
    device: Any,
    *,
    config: Mapping[str, Any] | None = None,
    release: str = "bfloat16",
) -> Any:
    """:func:`decide` in a stage process: the ``torch.dtype`` to load weights in.

    ``config``: the checkpoint's ``config.json`` (its ``torch_dtype``), else
    ``release`` is the weights' dtype. A ``torch.dtype`` passes through
    unchanged (callers that chose already). On CUDA, torch says whether the
    GPU computes bfloat16.
    """
    import torch

    if isinstance(requested, torch.dtype):
        return requested
    device = torch.device(device)
    gpu_name = gpu_bf16 = None
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        gpu_name = torch.cuda.get_device_name(index)
        gpu_bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))
    stored, source = checkpoint_dtype(config, release)
    try:
        decision = decide(
            requested,
            device=device.type,
            checkpoint=stored,
            checkpoint_source=source,
            gpu_name=gpu_name,
            gpu_bf16=gpu_bf16,
        )
    except PrecisionError as exc:
        raise ValueError(f"{exc.message}; fix: {exc.hint}") from None
    return getattr(torch, decision.dtype)
