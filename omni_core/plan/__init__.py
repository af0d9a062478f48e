"""Planning: from a resolved deployment and a GPU inventory to a DeploymentPlan.

The public surface: :func:`plan_deployment`, the inventory functions, and the
plain data a placement policy works with. The modules behind it are one
concept each: ``expand`` (replicas), ``policies`` (built-in placement),
``checks`` (what every plan must pass), ``processes``, ``weights``, ``mps``,
``endpoints``, ``estimates`` (memory arithmetic for model plugins) and
``render`` (the table ``omni plan`` prints).
"""

from .inventory import apply_cluster, detect_inventory, inventory_from_cluster, resolve_inventory
from .model import (
    Assignment,
    DeploymentPlan,
    GpuDevice,
    GpuInventory,
    MemoryEstimate,
    PlacementRequest,
    PlacementResult,
    ProcessPlan,
    Refusal,
    StageInstance,
)
from .planner import effective_policy, plan_deployment

__all__ = [
    "Assignment",
    "DeploymentPlan",
    "GpuDevice",
    "GpuInventory",
    "MemoryEstimate",
    "PlacementRequest",
    "PlacementResult",
    "ProcessPlan",
    "Refusal",
    "StageInstance",
    "apply_cluster",
    "detect_inventory",
    "effective_policy",
    "inventory_from_cluster",
    "plan_deployment",
    "resolve_inventory",
]
