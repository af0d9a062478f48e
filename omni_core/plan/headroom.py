"""Whether what the memory shares leave of a GPU holds what no share covers.

Why: an engine's share (``engine.mem_fraction_static``, as SGLang's, or its
``gpu_memory_fraction``) holds its weights and KV cache, sized at start-up to
fill it; its activations and CUDA graphs, and every GPU stage that declares
no share (an encoder, a vocoder), take what the shares leave. The model
plugins estimate those (``omni_estimate_memory``), yet a plan whose shares
left too little said nothing, and the first batch of long vocoder chunks ran
the GPU out of memory under load. The estimates are approximate, so the plan
warns rather than refuses, and says what to change.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..schema.sizes import format_bytes
from .model import Assignment, GpuPlan, MemoryEstimate, StageInstance


def headroom_notes(
    ledger: Mapping[int, GpuPlan],
    instances: Mapping[str, StageInstance],
    assignments: Mapping[str, Assignment],
    estimates: Mapping[str, MemoryEstimate],
    limit: float,
) -> list[str]:
    """A warning per GPU whose unshared memory is less than its stages' estimates need."""
    notes = []
    for gpu, plan in ledger.items():
        committed = plan.committed
        if plan.memory_bytes is None or committed is None:
            continue
        left = int(plan.memory_bytes * (limit - committed))
        needs: dict[str, int] = {}
        for name in plan.stages:
            instance, assignment = instances[name], assignments[name]
            estimate = estimates.get(instance.stage)
            if estimate is None:
                continue
            ranks = max(len(assignment.gpus), 1)
            if instance.is_engine:  # its share holds weights and cache, not its activations
                need = estimate.overhead_bytes
            elif name in plan.undeclared_stages:
                need = estimate.total_bytes
            else:  # a declared share holds the whole stage
                continue
            needs[instance.stage] = needs.get(instance.stage, 0) + need // ranks
        total = sum(needs.values())
        if total <= left:
            continue
        parts = ", ".join(f"{stage} {format_bytes(need)}" for stage, need in needs.items())
        notes.append(
            f"GPU {gpu} may run out of memory under load: the memory shares ({committed:.2f} of "
            f"{format_bytes(plan.memory_bytes)}, limit {limit:g}) leave "
            f"{format_bytes(max(left, 0))}, and its stages are estimated to need "
            f"{format_bytes(total)} beside them ({parts}: the engines' activations and "
            "graphs, the other stages whole). Lower "
            "an engine's mem_fraction_static, a vocoder's factory.max_batch_size or "
            "max_chunk_frames, or move a stage to another GPU (omni plan prints each "
            "estimate with --placement.policy auto)"
        )
    return notes
