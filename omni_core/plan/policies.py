"""The built-in placement policies: ``declared``, ``colocate``, ``cpu`` and ``auto``.

They are registered through the same hook as a plugin's
(:mod:`omni_core.builtins.placement`), and what they return passes the same
checks (:mod:`omni_core.plan.checks`). A policy only decides devices and
memory shares; processes, weight sharing, MPS and endpoints follow from that.
"""

from __future__ import annotations

import math

from ..placement import (
    Assignment,
    PlacementPolicy,
    PlacementRequest,
    PlacementResult,
    StageInstance,
)
from ..schema.sizes import format_bytes

CONTEXT_BYTES = 512 * 1024**2
"""What ``auto`` sets aside per process and GPU beyond the stages' own needs:
the CUDA context, the allocator's slack, NCCL buffers."""

_SHARE_FIELDS = "gpu_memory_fraction (or total_reserve_bytes)"


def declared_assignment(instance: StageInstance, gpus: tuple[int, ...]) -> Assignment:
    """``instance`` on ``gpus`` with the share its config declares (if any)."""
    return Assignment(
        instance.name,
        gpus,
        instance.gpu_memory_fraction,
        instance.total_reserve_bytes,
        "declared" if instance.declares_share else "none",
    )


def _replicas_without_devices(request: PlacementRequest) -> dict[str, list[StageInstance]]:
    missing: dict[str, list[StageInstance]] = {}
    for instance in request.instances:
        if instance.uses_gpu and instance.num_replicas > 1 and instance.device_source == "stage":
            missing.setdefault(instance.logical_process, []).append(instance)
    return missing


class DeclaredPolicy(PlacementPolicy):
    """Honour each stage's ``gpu`` (or its replica's ``replica_devices``) as written."""

    name = "declared"
    description = "each stage on the GPU it declares, with the memory share it declares"

    def place(self, request: PlacementRequest) -> PlacementResult:
        result = PlacementResult()
        missing = _replicas_without_devices(request)
        for process, instances in missing.items():
            first = instances[0]
            count = first.num_replicas * first.tp_size
            known = request.inventory.count or 0
            example = (
                list(range(count)) if known >= count else list(first.gpus) * first.num_replicas
            )
            result.refuse(
                f"process {process!r} has {first.num_replicas} replicas with GPU stages "
                f"({', '.join(sorted({i.stage for i in instances}))}) but no replica_devices; "
                "the declared policy places only what is written",
                stage=first.stage,
                fix=f"write processes.{process}.replica_devices with {count} GPU ids "
                f"(e.g. {example}), or use placement policy auto",
            )
        if result.refusals:
            return result
        for instance in request.instances:
            result.assign(declared_assignment(instance, instance.gpus if instance.uses_gpu else ()))
        return result


class ColocatePolicy(PlacementPolicy):
    """Every GPU stage on one GPU, each process on a declared memory budget.

    On one GPU the processes allocate independently; without declared shares
    the first to start takes what it likes and a later one runs out of memory
    minutes into loading. So every *budget holder* must declare its share: each
    engine stage, and each GPU stage of a process without an engine stage. A
    non-engine stage inside an engine's process (a vocoder in the talker's
    process) allocates from that process and may go undeclared; it is then
    listed among the GPU's undeclared stages.
    """

    name = "colocate"
    description = "every GPU stage on one GPU; every process must declare its memory share"

    def place(self, request: PlacementRequest) -> PlacementResult:
        result = PlacementResult()
        gpu_instances = request.gpu_instances()
        declared = [g for i in gpu_instances if i.device_source == "stage" for g in i.gpus]
        target = min(declared or [g for i in gpu_instances for g in i.gpus] or [0])
        for instance in gpu_instances:
            if instance.tp_size > 1:
                result.refuse(
                    f"stage {instance.name!r}: tp_size {instance.tp_size} needs "
                    f"{instance.tp_size} GPUs, but colocate puts every GPU stage on GPU {target}",
                    stage=instance.stage,
                    fix="use placement policy declared or auto for tensor-parallel stages",
                )
            elif instance.device_source == "replica_devices" and instance.gpus != (target,):
                result.refuse(
                    f"stage {instance.name!r}: processes.{instance.logical_process}."
                    f"replica_devices puts it on GPU {instance.gpus[0]}, but colocate puts "
                    f"every GPU stage on GPU {target}",
                    stage=instance.stage,
                    gpu=instance.gpus[0],
                    fix=f"remove processes.{instance.logical_process}.replica_devices "
                    "or use placement policy declared",
                )
        undeclared = sorted(
            {i.stage for i in self._budget_holders(gpu_instances) if not i.declares_share}
        )
        for stage in undeclared:
            result.refuse(
                f"stage {stage!r}: colocate puts every GPU stage on GPU {target} and needs its "
                f"memory share; {stage} declares no {_SHARE_FIELDS}",
                stage=stage,
                gpu=target,
                fix=f"declare {_SHARE_FIELDS} for {', '.join(undeclared)} "
                f"(e.g. [stages.{undeclared[0]}] gpu_memory_fraction = 0.2, "
                f"or --{undeclared[0]}.gpu_memory_fraction 0.2)",
            )
        if result.refusals:
            return result
        for instance in request.instances:
            gpus = (target,) if instance.uses_gpu else ()
            result.assign(declared_assignment(instance, gpus))
        for instance in gpu_instances:
            if not instance.declares_share and not instance.is_engine:
                result.notes.append(
                    f"colocate: stage {instance.name!r} declares no memory share; it runs "
                    f"inside process {instance.process!r} and is budgeted within its share"
                )
        return result

    @staticmethod
    def _budget_holders(instances: list[StageInstance]) -> list[StageInstance]:
        with_engine = {i.process for i in instances if i.is_engine}
        return [i for i in instances if i.is_engine or i.process not in with_engine]


class CpuPolicy(PlacementPolicy):
    """Every stage on the host: run any pipeline on a machine without GPUs."""

    name = "cpu"
    description = "every stage on the host, no GPU (slow; for machines without GPUs)"

    def place(self, request: PlacementRequest) -> PlacementResult:
        result = PlacementResult()
        for instance in request.instances:
            result.assign(Assignment(instance.name))
        moved = sorted({i.stage for i in request.instances if i.uses_gpu})
        if moved:
            result.notes.append(
                f"cpu: GPU stages {', '.join(moved)} run on the host; "
                "their gpu ids and memory shares are not used"
            )
        return result


def _ceil_fraction(value: float) -> float:
    """Round a share up to 0.001, so the promised fraction covers the need."""
    return math.ceil(value * 1000 - 1e-9) / 1000


class AutoPolicy(PlacementPolicy):
    """Fit processes onto the GPUs of the inventory from per-stage memory estimates.

    The unit of placement is a process (its stages share a GPU by rule), or
    one rank of a tensor-parallel process. A stage's need is its declared
    share if it has one, else the model plugin's estimate (weights by dtype
    plus the engine's KV budget); a GPU stage with neither makes ``auto``
    refuse, naming it. Processes are placed largest first, each on the GPU
    with the most memory left after it (worst fit): a serving deployment wants
    headroom and fewer processes time-slicing one GPU more than it wants spare
    GPUs. Ties go to the lower GPU id, so plans are deterministic. Shares are filled in as
    fractions of the chosen GPU. Declared ``gpu`` ids and ``replica_devices``
    are not used: the policy chooses.
    """

    name = "auto"
    description = "fit processes onto the inventory's GPUs from memory estimates; fills in shares"
    uses_estimates = True

    def place(self, request: PlacementRequest) -> PlacementResult:
        result = PlacementResult()
        inventory = request.inventory
        memories = [d.memory_bytes for d in inventory.devices]
        if not inventory.count_known or not memories or None in memories:
            result.refuse(
                "auto needs the number of GPUs and their memory; the inventory is "
                + inventory.describe(),
                fix="declare the hardware: --gpus N --gpu-memory 80GiB "
                "(or [cluster] gpus / gpu_memory in the deploy file)",
            )
            return result
        needs = self._needs(request, result)
        if result.refusals:
            return result
        free = [request.memory_limit] * len(memories)
        groups = request.processes()
        order = sorted(
            (p for p in groups if any(i.uses_gpu for i in groups[p])),
            key=lambda p: -self._group_need(groups[p], needs, max(memories)),  # type: ignore[type-var]
        )
        for instance in request.instances:
            if not instance.uses_gpu:
                result.assign(Assignment(instance.name))
        for process in order:
            self._place_group(process, groups[process], needs, memories, free, result)  # type: ignore[arg-type]
        if not result.refusals and any(
            i.uses_gpu and i.device_source == "replica_devices" for i in request.instances
        ):
            result.notes.append("auto: replica_devices are not used; the policy chose the GPUs")
        return result

    # -- needs ----------------------------------------------------------------
    @staticmethod
    def _needs(
        request: PlacementRequest, result: PlacementResult
    ) -> dict[str, tuple[int, float, str]]:
        """Per GPU instance and rank: (bytes, fraction, source); bytes or fraction is 0."""
        needs: dict[str, tuple[int, float, str]] = {}
        missing: list[str] = []
        for instance in request.gpu_instances():
            if instance.total_reserve_bytes is not None:
                needs[instance.name] = (instance.total_reserve_bytes, 0.0, "declared")
            elif instance.gpu_memory_fraction is not None:
                needs[instance.name] = (0, instance.gpu_memory_fraction, "declared")
            elif instance.stage in request.estimates:
                total = request.estimates[instance.stage].total_bytes
                needs[instance.name] = (-(-total // instance.tp_size), 0.0, "estimate")
            elif instance.stage not in missing:
                missing.append(instance.stage)
        for stage in missing:
            result.refuse(
                f"stage {stage!r}: auto needs its memory, but no plugin estimates it and it "
                f"declares no {_SHARE_FIELDS}",
                stage=stage,
                fix=f"declare {_SHARE_FIELDS} for {', '.join(missing)}",
            )
        return needs

    @staticmethod
    def _fraction(need: tuple[int, float, str], memory: int) -> float:
        nbytes, fraction, _ = need
        return fraction if fraction else _ceil_fraction(nbytes / memory)

    def _group_need(self, instances: list[StageInstance], needs: dict, memory: int) -> float:
        rank_need = sum(self._fraction(needs[i.name], memory) for i in instances if i.uses_gpu)
        return rank_need * max(i.tp_size for i in instances)

    # -- placing --------------------------------------------------------------
    def _place_group(
        self,
        process: str,
        instances: list[StageInstance],
        needs: dict[str, tuple[int, float, str]],
        memories: list[int],
        free: list[float],
        result: PlacementResult,
    ) -> None:
        gpu_instances = [i for i in instances if i.uses_gpu]
        tp = max(i.tp_size for i in gpu_instances)
        per_gpu = []
        for gpu, memory in enumerate(memories):
            fractions = [self._fraction(needs[i.name], memory) for i in gpu_instances]
            context = _ceil_fraction(CONTEXT_BYTES / memory)
            per_gpu.append((gpu, fractions, sum(fractions) + context))
        fits = sorted(
            (need - free[gpu], gpu) for gpu, _, need in per_gpu if need <= free[gpu] + 1e-9
        )
        if len(fits) < tp:
            detail = "; ".join(
                f"GPU {gpu} has {free[gpu]:.2f} ({format_bytes(int(free[gpu] * memories[gpu]))})"
                f" left, needs {need:.2f} ({format_bytes(int(need * memories[gpu]))})"
                for gpu, _, need in per_gpu
            )
            what = "rank of " if tp > 1 else ""
            stages = ", ".join(i.stage for i in gpu_instances)
            result.refuse(
                f"{len(fits)}/{len(memories)} GPUs fit {what}process {process!r} "
                f"(stage{'s' if len(gpu_instances) > 1 else ''} {stages})"
                + (f", which needs {tp} GPUs" if tp > 1 else "")
                + f": {detail}",
                stage=gpu_instances[0].stage,
                fix="plan for more or larger GPUs (--gpus N, --gpu-memory SIZE), "
                "or lower the engines' KV budgets (engine.max_total_tokens)",
            )
            return
        chosen = sorted(gpu for _, gpu in fits[:tp])
        for gpu in chosen:
            free[gpu] -= per_gpu[gpu][2]
        for index, instance in enumerate(gpu_instances):
            need = needs[instance.name]
            fraction = per_gpu[chosen[0]][1][index]
            result.assign(
                Assignment(
                    instance.name,
                    tuple(chosen),
                    None if need[0] and need[2] == "declared" else fraction,
                    need[0] if need[2] == "declared" and need[0] else None,
                    need[2],
                )
            )


BUILTIN_POLICIES: list[type[PlacementPolicy]] = [
    DeclaredPolicy,
    ColocatePolicy,
    CpuPolicy,
    AutoPolicy,
]
