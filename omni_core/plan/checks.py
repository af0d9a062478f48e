"""Checks every plan passes, whichever policy made it.

A policy proposes; these checks admit. They run on the result of any policy,
built-in or plugin, so no policy can hand the runtime a GPU that does not
exist, a process split across GPUs, an over-committed GPU, or two processes
that would size their memory first-come-first-served on one GPU.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..engine.backends import engine_settings
from ..errors import OmniError
from ..schema import PipelineConfig
from ..schema.sizes import format_bytes
from .model import Assignment, GpuPlan, PlacementRequest, Refusal, StageInstance
from .usage import process_on

_EPSILON = 1e-9


def check_engine_settings(config: PipelineConfig) -> list[Refusal]:
    """Every engine stage's ``engine.*`` group is accepted by the backend it selects.

    Checked here, before any process starts (see :func:`engine_settings`).
    """
    problems: list[Refusal] = []
    for stage in config.stages:
        if not stage.is_engine or getattr(stage, "engine", None) is None:
            continue
        try:
            engine_settings(stage)
        except OmniError as exc:
            problems.append(Refusal(exc.message, stage=stage.name, fix=exc.hint))
    return problems


def check_assignments(
    request: PlacementRequest, assignments: Mapping[str, Assignment]
) -> list[Refusal]:
    """Every instance assigned once, with a device list of the right shape, on real GPUs."""
    problems: list[Refusal] = []
    names = {i.name for i in request.instances}
    for extra in sorted(set(assignments) - names):
        problems.append(Refusal(f"the policy assigned {extra!r}, which is not a stage instance"))
    beyond: dict[int, list[str]] = {}
    by_name = {i.name: i for i in request.instances}
    for instance in request.instances:
        assignment = assignments.get(instance.name)
        if assignment is None:
            problems.append(
                Refusal(
                    f"stage {instance.name!r}: the policy did not place it", stage=instance.stage
                )
            )
            continue
        gpus = assignment.gpus
        if gpus and len(gpus) != instance.tp_size:
            problems.append(
                Refusal(
                    f"stage {instance.name!r}: placed on GPUs {list(gpus)} but tp_size = "
                    f"{instance.tp_size}; it needs one GPU per rank",
                    stage=instance.stage,
                )
            )
        if len(set(gpus)) != len(gpus):
            problems.append(
                Refusal(
                    f"stage {instance.name!r}: two tensor-parallel ranks on one GPU {list(gpus)}",
                    stage=instance.stage,
                )
            )
        fraction = assignment.gpu_memory_fraction
        if fraction is not None and assignment.total_reserve_bytes is not None:
            problems.append(
                Refusal(
                    f"stage {instance.name!r}: the policy gave it both a memory fraction "
                    f"({fraction:g}) and a byte reserve "
                    f"({format_bytes(assignment.total_reserve_bytes)}); "
                    "an assignment promises one or the other",
                    stage=instance.stage,
                    fix="the placement policy must set gpu_memory_fraction or "
                    "total_reserve_bytes, not both",
                )
            )
        if fraction is not None and not 0 < fraction <= 1:
            problems.append(
                Refusal(
                    f"stage {instance.name!r}: memory fraction {fraction} is not in (0, 1]",
                    stage=instance.stage,
                )
            )
        for gpu in gpus:
            if not request.inventory.has(gpu):
                beyond.setdefault(gpu, []).append(instance.name)
    for gpu, stages in sorted(beyond.items()):
        count = request.inventory.count or 0
        problems.append(
            Refusal(
                f"GPU {gpu} (asked for by stage{'s' if len(stages) > 1 else ''} "
                f"{', '.join(stages)}) is beyond the inventory: "
                f"{request.inventory.describe()}",
                stage=stages[0],
                gpu=gpu,
                fix=(
                    f"plan for a machine with more GPUs (--gpus {max(beyond) + 1}) or move "
                    f"{'it' if len(stages) == 1 else 'them'} to "
                    + (f"GPUs 0-{count - 1}" if count > 1 else "GPU 0" if count else "the host")
                    + (
                        f" (--{by_name[stages[0]].stage}.gpu 0)"
                        if count and len(stages) == 1
                        else ""
                    )
                ),
            )
        )
    return problems


def check_processes(
    request: PlacementRequest, assignments: Mapping[str, Assignment]
) -> list[Refusal]:
    """A process (or TP rank) runs on one GPU at most."""
    problems: list[Refusal] = []
    where: dict[str, dict[int, list[str]]] = {}
    for instance in request.instances:
        for rank, gpu in enumerate(assignments[instance.name].gpus):
            where.setdefault(process_on(instance, rank), {}).setdefault(gpu, []).append(
                instance.name
            )
    for process, gpus in where.items():
        if len(gpus) > 1:
            detail = "; ".join(f"GPU {g}: {', '.join(s)}" for g, s in sorted(gpus.items()))
            problems.append(
                Refusal(
                    f"process {process!r} spans GPUs {sorted(gpus)} ({detail}); "
                    "the stages of one process run on one GPU",
                    stage=next(iter(gpus.values()))[0],
                    fix="put the process's GPU stages on one GPU, or give them different processes",
                )
            )
    return problems


def check_gpus(
    request: PlacementRequest,
    assignments: Mapping[str, Assignment],
    ledger: Mapping[int, GpuPlan],
) -> tuple[list[Refusal], list[str]]:
    """Memory promised per GPU within the limit; no racing for unpromised memory.

    An engine stage without a declared share sizes its memory pool from what
    it finds free at start-up; two processes doing that on one GPU get
    whatever their start order leaves them. Stages that only load weights
    (encoders, vocoders) are reported as undeclared but not refused.
    """
    problems: list[Refusal] = []
    notes: list[str] = []
    by_name: dict[str, StageInstance] = {i.name: i for i in request.instances}
    limit = request.memory_limit
    for gpu, plan in ledger.items():
        committed = plan.committed
        if committed is None:
            notes.append(
                f"GPU {gpu}: {format_bytes(plan.total_reserve_bytes_sum)} reserved in bytes cannot "
                "be checked against its memory, which is unknown (pass --gpu-memory)"
            )
            committed = plan.gpu_memory_fraction_sum
        if committed > limit + _EPSILON:
            problems.append(
                Refusal(
                    f"GPU {gpu}: memory shares sum to {committed:.2f}, over the limit {limit:g} "
                    f"({_shares(plan, assignments)})",
                    gpu=gpu,
                    fix=f"lower the shares (or the engines' mem_fraction_static) of the stages "
                    f"on GPU {gpu}, or move one to another GPU",
                )
            )
        racing: dict[str, list[str]] = {}
        for name in plan.undeclared_stages:
            instance = by_name[name]
            if instance.is_engine:
                rank = assignments[name].gpus.index(gpu)
                racing.setdefault(process_on(instance, rank), []).append(name)
        if len(racing) > 1:
            stages = sorted(s for names in racing.values() for s in names)
            problems.append(
                Refusal(
                    f"GPU {gpu}: processes {', '.join(sorted(racing))} each run an engine stage "
                    f"without a declared memory share ({', '.join(stages)}); each would size "
                    "its memory from what is free when it starts, first come first served",
                    stage=by_name[stages[0]].stage,
                    gpu=gpu,
                    fix="declare gpu_memory_fraction (or total_reserve_bytes) for "
                    + ", ".join(sorted({by_name[s].stage for s in stages}))
                    + ", or put them on different GPUs",
                )
            )
    return problems, notes


def _shares(plan: GpuPlan, assignments: Mapping[str, Assignment]) -> str:
    parts = []
    for name in plan.stages:
        assignment = assignments[name]
        if assignment.gpu_memory_fraction is not None:
            parts.append(f"{name} {assignment.gpu_memory_fraction:g}")
        elif assignment.total_reserve_bytes is not None:
            parts.append(f"{name} {format_bytes(assignment.total_reserve_bytes)}")
        elif name in plan.engine_memory_fractions:
            fraction = plan.engine_memory_fractions[name]
            parts.append(f"{name} engine.mem_fraction_static {fraction:g}")
    return ", ".join(parts)
