"""Each stage's weight dtype (and quantization), decided at plan time where the device is known.

The decision is :func:`omni_core.engine.precision.decide`'s, the same call a
stage process makes when it loads, so ``omni plan`` prints what will load:
after placement, each stage with a ``factory.dtype`` field is judged on the
device it landed on (the host's CPU flags, or the GPU's NVML name). A choice
the device cannot run well is a refusal naming the path and the fix (exit 2).

The checkpoint's dtype is read from the ``config.json`` a stage's weights
come with (``checkpoint_config`` on its factory-argument class, default
``config.json``) under a local ``model_path``; a hub id or a preset without
one gets the release's dtype (``release_dtype``, default bfloat16); so does
every stage whose ``checkpoint_config`` is None (the release computes it in
that dtype whatever its weights are stored in: MOSS-TTS's codec).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..engine.precision import (
    QUANTIZED_KERNELS,
    Precision,
    PrecisionError,
    checkpoint_dtype,
    cpu_flags,
    decide,
)
from .estimates import read_local_config
from .model import Assignment, GpuInventory, Refusal


def stage_checkpoint_dtype(stage: Any, model_path: str) -> tuple[str, str]:
    """(dtype, source) of the weights ``stage`` loads, without loading them."""
    args = type(stage.factory)
    release = str(getattr(args, "release_dtype", "bfloat16"))
    name = getattr(args, "checkpoint_config", "config.json")
    if name is None:  # the release computes the stage in release_dtype, whatever its weights
        return checkpoint_dtype(None, release)
    directory, file = os.path.split(os.path.join(model_path or "", name))
    config = read_local_config(directory, file) if model_path else None
    return checkpoint_dtype(config, release)


def has_dtype(stage: Any) -> bool:
    return "dtype" in type(stage.factory).model_fields


def quantization_of(stage: Any) -> str:
    return str(getattr(stage.factory, "quantization", None) or "none")


def plan_precisions(
    config: Any,
    assignments: Mapping[str, Assignment],
    instances: Mapping[str, str],
    inventory: GpuInventory,
    problems: list[Refusal],
) -> dict[str, Precision]:
    """The precision of every stage with a ``factory.dtype``, by stage name.

    ``instances`` maps instance names to stage names; a stage is judged on its
    first instance's device (replicas of one stage share a device kind).
    Refusals are appended to ``problems``.
    """
    first: dict[str, Assignment] = {}
    for instance, assignment in assignments.items():
        first.setdefault(instances.get(instance, instance), assignment)
    names = {d.index: d.name for d in inventory.devices}
    found: dict[str, Precision] = {}
    for stage in config.stages:
        if not has_dtype(stage) or stage.name not in first:
            continue
        gpus = first[stage.name].gpus
        device = "cuda" if gpus else "cpu"
        path = f"stages.{stage.name}.factory.dtype"
        dtype, source = stage_checkpoint_dtype(stage, config.model_path)
        try:
            precision = decide(
                stage.factory.dtype,
                device=device,
                checkpoint=dtype,
                checkpoint_source=source,
                gpu_name=names.get(gpus[0]) if gpus else None,
                what=path,
            )
        except PrecisionError as exc:
            problems.append(Refusal(exc.message, stage=stage.name, fix=exc.hint))
            continue
        quantization = quantization_of(stage)
        if quantization != "none":
            problem = quantization_problem(quantization, device, precision.dtype, stage.name)
            if problem is not None:
                problems.append(problem)
                continue
            precision = Precision(precision.dtype, f"{precision.reason}; {_said(quantization)}")
        if row_copies_of(stage):
            problem = row_copy_problem(device, precision.dtype, quantization, stage.name)
            if problem is not None:
                problems.append(problem)
                continue
            precision = Precision(
                precision.dtype,
                f"{precision.reason}; float16 copies of the blocked linear weights for one- "
                "and two-row products (fbgemm): their memory twice over",
            )
        found[stage.name] = precision
    return found


def row_copies_of(stage: Any) -> bool:
    return bool(getattr(stage.factory, "fp16_row_weights", False))


def row_copy_problem(device: str, dtype: str, quantization: str, stage: str) -> Refusal | None:
    """float16 row copies are of bf16 CPU weights that stay blocked; else refused."""
    path = f"stages.{stage}.factory.fp16_row_weights"
    if device != "cpu":
        return Refusal(
            f"{path} = true on a GPU: the copies serve fbgemm's CPU kernel "
            "(omni_core.engine.cpu_row_copy)",
            stage=stage,
            fix=f'remove {path}, or run the stage on the host (placement policy "cpu")',
        )
    if dtype != "bfloat16":
        return Refusal(
            f"{path} = true with {dtype} weights (stages.{stage}.factory.dtype): the copies "
            "are of bf16 weights",
            stage=stage,
            fix=f'set stages.{stage}.factory.dtype = "bfloat16" (or remove {path})',
        )
    if quantization != "none":
        return Refusal(
            f"{path} = true with factory.quantization = {quantization!r}: int8 layers hold "
            "no bf16 weight to copy",
            stage=stage,
            fix=f"use one of them: remove {path} or stages.{stage}.factory.quantization",
        )
    return None


def _said(quantization: str) -> str:
    """How ``omni plan`` names a stage's quantization beside its dtype."""
    if quantization == "w8a8_int8":
        vnni = [flag for flag in VNNI_FLAGS if flag in cpu_flags()]
        how = f"this CPU has {vnni[0]}" if vnni else "this CPU has no VNNI: slower than with it"
        return f"w8a8_int8 linear layers (int8 weights and per-row int8 activations; {how})"
    return f"{quantization} weight-only linear layers"


#: CPU flags of an integer dot product oneDNN's int8 kernel runs on (best first).
VNNI_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")


#: (quantization, the stage's dtype) a quantization refuses: why, and the other fix than
#: bfloat16 (None: removing the quantization).
UNFIT_ACTIVATIONS = {
    ("int8", "float32"): ("torch's int8 kernel is slower then than float32 weights", None),
    ("w8a8_int8", "float16"): ("its products return float32 or bfloat16", '"float32"'),
}


def quantization_problem(quantization: str, device: str, dtype: str, stage: str) -> Refusal | None:
    """int8 weight-only runs on torch's CPU kernel with bf16/fp16 activations, w8a8_int8 on
    oneDNN's with float32/bf16 ones; else refused."""
    path = f"stages.{stage}.factory.quantization"
    if quantization in QUANTIZED_KERNELS and device != "cpu":
        layers, kernel = QUANTIZED_KERNELS[quantization]
        return Refusal(
            f"{path} = {quantization!r} on a GPU: omni's {layers} use {kernel}; "
            "not implemented yet on CUDA",
            stage=stage,
            fix=f'remove {path}, or run the stage on the host (placement policy "cpu")',
        )
    unfit = UNFIT_ACTIVATIONS.get((quantization, dtype))
    if unfit is not None:
        why, instead = unfit
        return Refusal(
            f"{path} = {quantization!r} with {dtype} activations "
            f"(stages.{stage}.factory.dtype resolves to {dtype}): {why}",
            stage=stage,
            fix=f'set stages.{stage}.factory.dtype = "bfloat16" (or {instead or f"remove {path}"})',
        )
    return None
