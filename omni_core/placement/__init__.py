"""The placement contract: what a placement policy receives, implements and returns.

One place for all of it, below the planner: a policy plugin (and the hook
specs) import this package and nothing of :mod:`omni_core.plan`, which
depends on this, never the other way.
"""

from .inventory import ClusterNode, GpuDevice, GpuInventory
from .policy import PlacementPolicy
from .request import MemoryEstimate, PlacementRequest, StageInstance
from .result import Assignment, PlacementResult, Refusal

__all__ = [
    "Assignment",
    "ClusterNode",
    "GpuDevice",
    "GpuInventory",
    "MemoryEstimate",
    "PlacementPolicy",
    "PlacementRequest",
    "PlacementResult",
    "Refusal",
    "StageInstance",
]
