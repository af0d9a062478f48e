"""How each torch engine stage will decode: eager, compiled, CUDA graphs, prepacked weights.

Why in the plan: compiled steps and prepacked weights cost start-up time and
memory, so an operator should see what a deploy file asks for before any
process starts, beside the precision it applies to. The engine makes the same
decision (:func:`~omni_core.engine.buckets.static_plan`) when it starts, and
its log adds what only the loaded model knows (which decoders were packed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..engine.backends import engine_settings
from ..engine.buckets import static_plan
from .model import Assignment


def plan_decodes(
    config: Any,
    assignments: Mapping[str, Assignment],
    instances: Mapping[str, str],
    precisions: Mapping[str, Any],
) -> dict[str, str]:
    """Each torch engine stage's decode plan in words, by stage name (first instance's device)."""
    device_of: dict[str, str] = {}
    for instance, assignment in assignments.items():
        stage = instances.get(instance, instance)
        device_of.setdefault(stage, "cuda" if assignment.gpus else "cpu")
    found: dict[str, str] = {}
    for stage in config.stages:
        if not getattr(stage, "is_engine", False) or stage.name not in device_of:
            continue
        settings = engine_settings(stage)
        if settings.backend != "torch":
            continue
        plan = static_plan(settings, device_of[stage.name])
        words = plan.reason
        precision = precisions.get(stage.name)
        dtype = getattr(precision, "dtype", None)
        if plan.prepack and dtype not in (None, "bfloat16"):
            words += f"; engine.cpu_weight_prepack packs nothing: the stage computes in {dtype}"
        elif settings.cpu_weight_prepack and not plan.prepack:
            words += "; engine.cpu_weight_prepack packs nothing on a GPU"
        found[stage.name] = words
    return found
