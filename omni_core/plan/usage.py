"""The per-GPU ledger: which stages and processes each GPU holds, and what is promised.

Built from the instances and a policy's assignments; the checks read it (over
the limit? several processes racing for memory?) and the plan prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .expand import tp_process_name
from .model import Assignment, GpuInventory, GpuPlan, StageInstance, round_fraction


def process_on(instance: StageInstance, rank: int) -> str:
    """The OS process that runs ``instance``'s rank ``rank``."""
    return tp_process_name(instance.process, rank) if instance.tp_size > 1 else instance.process


def gpu_ledger(
    instances: Iterable[StageInstance],
    assignments: Mapping[str, Assignment],
    inventory: GpuInventory,
) -> dict[int, GpuPlan]:
    """One :class:`GpuPlan` per GPU that holds anything, by GPU id."""
    ledger: dict[int, GpuPlan] = {}
    seen: dict[int, set[str]] = {}
    for instance in instances:
        assignment = assignments[instance.name]
        for rank, gpu in enumerate(assignment.gpus):
            plan = ledger.get(gpu)
            if plan is None:
                plan = ledger[gpu] = GpuPlan(gpu, inventory.memory_of(gpu))
                seen[gpu] = set()
            plan.stages.append(instance.name)
            process = process_on(instance, rank)
            if process not in seen[gpu]:
                seen[gpu].add(process)
                plan.processes.append(process)
            if assignment.gpu_memory_fraction is not None:
                plan.gpu_memory_fraction_sum += assignment.gpu_memory_fraction
            elif assignment.total_reserve_bytes is not None:
                plan.total_reserve_bytes_sum += assignment.total_reserve_bytes
            elif instance.engine_memory_fraction is not None:
                plan.engine_memory_fractions[instance.name] = instance.engine_memory_fraction
            else:
                plan.undeclared_stages.append(instance.name)
    for plan in ledger.values():
        plan.undeclared_stages.sort()
        plan.gpu_memory_fraction_sum = round_fraction(plan.gpu_memory_fraction_sum) or 0.0
    return {gpu: ledger[gpu] for gpu in sorted(ledger)}
