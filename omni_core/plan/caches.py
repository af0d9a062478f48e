"""How each torch engine stage on a GPU will size its KV cache, said (or refused) when planning.

Why: an engine stage placed with a memory share sizes its cache at start-up
from that share (``engine.mem_fraction_static``, else the share itself, see
:func:`omni_core.kit.stages.engine_settings`) less what its process holds by
then, its weights. A share too small for the weights used to surface as the
engine's error in the stage's log after every process had started; with the
model plugin's weight estimate the plan can say the same before anything
starts, and show the slots a running request gets. The engine keeps the last
word (:func:`omni_core.engine.budget.plan_slots`): it measures what it holds,
and gives no slot more than the model's ``max_position_embeddings``.

Where the deploy file leaves ``engine.max_running_requests`` unwritten, the
plan also decides it here, from the same positions
(:func:`omni_core.engine.budget.memory_sized_slots`): the number is put in the
plan (:attr:`~omni_core.plan.model.DeploymentPlan.running_requests`), so the
runtime's admission and the engine in its process use the plan's number rather
than each estimating its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..engine.backends import engine_settings
from ..engine.budget import MEMORY_SIZED_MAX_SLOTS, memory_sized_slots
from ..errors import OmniError
from ..schema.sizes import format_bytes
from .estimates import collect_estimates
from .model import Assignment, GpuInventory, MemoryEstimate, Refusal


def plan_caches(
    config: Any,
    assignments: Mapping[str, Assignment],
    instances: Mapping[str, str],
    inventory: GpuInventory,
    estimates: Mapping[str, MemoryEstimate],
    plugins: Any,
    problems: list[Refusal],
    running: dict[str, int] | None = None,
) -> dict[str, str]:
    """Each GPU torch engine stage's cache in words, by stage name (its first instance).

    ``running`` receives, by stage name, the ``engine.max_running_requests`` the
    plan sized from memory for stages whose deploy file left it unwritten.
    """
    running = {} if running is None else running
    first: dict[str, Assignment] = {}
    for instance, assignment in assignments.items():
        first.setdefault(instances.get(instance, instance), assignment)
    sized: dict[str, tuple[Any, Any, float]] = {}
    for stage in config.stages:
        assignment = first.get(stage.name)
        if not getattr(stage, "is_engine", False) or assignment is None or not assignment.gpus:
            continue
        settings = engine_settings(stage)
        if settings.backend != "torch":
            continue
        fraction = settings.mem_fraction_static
        if fraction is None:
            fraction = assignment.gpu_memory_fraction
        if "max_total_tokens" in settings.model_fields_set or fraction is None:
            continue  # a fixed number of positions: the estimate already says it
        sized[stage.name] = (stage, settings, fraction)
    if not sized:
        return {}
    if not estimates:
        try:
            estimates = collect_estimates(config, plugins)
        except OmniError:
            estimates = {}  # the plan does not need them; the lines are only left out
    found: dict[str, str] = {}
    for name, (stage, settings, fraction) in sized.items():
        gpu = first[name].gpus[0]
        memory = inventory.memory_of(gpu)
        estimate = estimates.get(name)
        named = "engine.mem_fraction_static" if settings.mem_fraction_static else "its share"
        share = f"{named} {fraction:g} of GPU {gpu}"
        if memory is None or estimate is None or not estimate.kv_bytes_per_token:
            found[name] = f"sized at start-up from {share}, less what its process holds then"
            continue
        ranks = max(getattr(stage, "tp_size", 1), 1)
        weights = estimate.weights_bytes // ranks
        per_token = max(estimate.kv_bytes_per_token // ranks, 1)
        room = int(memory * fraction) - weights
        slots = settings.max_running_requests
        if room < per_token * slots:
            problems.append(
                Refusal(
                    f"stage {name!r}: {share} ({format_bytes(int(memory * fraction))}) holds its "
                    f"weights ({format_bytes(weights)}, {estimate.source}) but leaves "
                    f"{format_bytes(max(room, 0))} for its KV cache: not one position for each "
                    f"of its {slots} running requests ({format_bytes(per_token)} each)",
                    stage=name,
                    gpu=gpu,
                    fix="raise its gpu_memory_fraction (or engine.mem_fraction_static), or set "
                    "engine.max_total_tokens",
                )
            )
            continue
        positions = room // per_token
        chosen = ""
        if "max_running_requests" not in settings.model_fields_set and estimate.max_positions:
            default = slots
            slots = memory_sized_slots(positions, estimate.max_positions, default)
            running[name] = slots
            chosen = (
                f"; engine.max_running_requests {slots}, sized from memory (as many requests "
                f"of the model's full length as the share holds, at least {default}, at most "
                f"{MEMORY_SIZED_MAX_SLOTS}; write it to choose)"
            )
        slot = positions // slots
        if estimate.max_positions and slot > estimate.max_positions:
            slot = estimate.max_positions
            why = " (capped at the model's max_position_embeddings; the rest stays free)"
        elif estimate.max_positions:
            why = ""
        else:
            why = " (each at most the model's max_position_embeddings)"
        found[name] = (
            f"{share} ({format_bytes(int(memory * fraction))}) less about "
            f"{format_bytes(weights)} of weights: about {positions:,} positions, "
            f"{slots} slots of {slot:,}{why}{chosen}"
        )
    return found


def with_sized_requests(config: Any, running: Mapping[str, int]) -> Any:
    """``config`` with the ``engine.max_running_requests`` the plan sized from memory
    written in (a copy; ``config`` is left as the user resolved it).

    Why: the plugins estimate what a stage beside an engine holds per request it
    runs (a vocoder keeps one stream's state for each); they are asked first with
    the backend's default, before the plan has sized the engine, and again with
    this copy, so ``omni plan``'s estimates and its memory warning count the
    requests the engine will really run.
    """
    if not running:
        return config
    copy = config.model_copy(deep=True)
    for stage in copy.stages:
        if stage.name in running:
            stage.engine = stage.engine.model_copy(
                update={"max_running_requests": running[stage.name]}
            )
    return copy
