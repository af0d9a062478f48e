"""Planning: from a resolved deployment and a GPU inventory to a DeploymentPlan.

The public surface: :func:`plan_deployment`, the inventory functions, and the
plain data a placement policy works with. The modules behind it are one
concept each: ``expand`` (replicas), ``policies`` (built-in placement),
``checks`` (what every plan must pass), ``processes``, ``weights``, ``mps``,
``endpoints``, ``nodes`` (multi-node placement),
``estimates`` (memory arithmetic for model plugins),
``render`` (the table ``omni plan`` prints) and ``picture`` (its SVG/HTML drawing).
"""

from importlib import import_module
from typing import Any

# Loaded on first use: importing the built-in policies (for `omni plugins
# list`) must not pay for the planner, the inventory and the renderer.
_EXPORTS = {
    **dict.fromkeys(
        (
            "apply_cluster",
            "detect_inventory",
            "inventory_for",
            "inventory_from_cluster",
            "resolve_inventory",
        ),
        "inventory",
    ),
    **dict.fromkeys(
        (
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
        ),
        "model",
    ),
    **dict.fromkeys(("effective_policy", "plan_deployment"), "planner"),
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
