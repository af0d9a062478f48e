"""Step 3: a placement policy that spreads the replicas of each process over the GPUs."""

from __future__ import annotations

from omni_core import PlacementPolicy
from omni_core.placement import Assignment, PlacementRequest, PlacementResult


class SpreadReplicas(PlacementPolicy):
    """Replica ``r`` of every process goes to GPU ``r mod N``, keeping declared shares.

    A pure function of its request: no I/O, no clock, so ``omni plan`` is
    deterministic. The planner checks what it returns (GPU ids exist, shares
    fit) exactly as it checks the built-in policies.
    """

    name = "spread-replicas"
    description = "replica r of each process on GPU r mod N"

    def place(self, request: PlacementRequest) -> PlacementResult:
        result = PlacementResult()
        count = request.inventory.count
        if not count:
            result.refuse(
                "spread-replicas needs to know the GPUs",
                fix="declare them: --gpus N --gpu-memory SIZE",
            )
            return result
        for instance in request.instances:
            gpus = (instance.replica % count,) if instance.uses_gpu else ()
            share = "declared" if instance.declares_share else "none"
            result.assign(
                Assignment(
                    instance.name,
                    gpus,
                    instance.gpu_memory_fraction,
                    instance.total_reserve_bytes,
                    share,
                )
            )
        return result
