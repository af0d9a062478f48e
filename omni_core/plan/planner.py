"""``plan_deployment``: from a resolved config and a GPU inventory to a DeploymentPlan.

A pure function: no I/O (GPU detection happens before, in the caller; only
``auto`` may read a local checkpoint's ``config.json`` through the model
plugins' estimates), no clock, no randomness. The steps:

0. every engine stage's ``engine.*`` group is accepted by its backend's declared
   settings (refused alone: no placement policy changes them);
1. expand replicas (``<stage>@r<i>``, ``<process>@r<i>``), check replica_devices;
2. the placement policy assigns devices and memory shares;
3. the checks admit the result: GPU ids within the inventory, one GPU per
   process, shares within the limit, no processes racing for memory;
4. processes (TP ranks ``<process>_tp<rank>``), env defaults, weight sharing,
   MPS and endpoints.

Every problem found in a step is collected, Kubernetes-style, and raised
together as one :class:`~omni_core.errors.ConfigError` (exit 2), with the
fixes and, when another policy would plan the deployment, its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, OmniError
from ..placement import PlacementPolicy
from ..plugins import OmniPlugins, get_plugins
from ..schema import PipelineConfig
from .admission import admission_limit
from .caches import plan_caches, with_sized_requests
from .checks import check_assignments, check_engine_settings, check_gpus, check_processes
from .decode import compile_startup_note, plan_decodes
from .endpoints import plan_endpoints
from .estimates import collect_estimates
from .expand import expand
from .headroom import headroom_notes
from .inventory import inventory_from_cluster
from .model import DeploymentPlan, GpuInventory, MemoryEstimate, PlacementRequest, Refusal
from .mps import plan_mps
from .nodes import assign_nodes
from .pages import plan_huge_pages
from .precision import plan_precisions
from .prefill import plan_prefills
from .processes import build_processes
from .threads import plan_cpu_threads
from .transports import check_cross_node, check_transports, plan_edges
from .usage import gpu_ledger
from .weights import plan_weight_share, sharing_estimates, start_waves


class Infeasible(Exception):
    """The deployment cannot be planned with this policy; carries every reason."""

    def __init__(self, refusals: list[Refusal]):
        self.refusals = refusals
        super().__init__("; ".join(r.message for r in refusals))


def effective_policy(config: PipelineConfig) -> str:
    """The policy the deployment chose, else its pipeline class's default.

    A deploy file that writes ``[placement] memory_limit`` but no policy must
    not silently lose the pipeline's own policy (``colocate`` for the
    colocated Qwen3-Omni), so an unwritten policy falls back to the class.
    """
    placement = config.placement
    if "policy" in placement.model_fields_set:
        return placement.policy
    return type(config).default_placement_policy or placement.policy


def plan_deployment(
    config: PipelineConfig,
    inventory: GpuInventory | None = None,
    plugins: OmniPlugins | None = None,
    *,
    policy: str | None = None,
) -> DeploymentPlan:
    """Plan ``config`` against ``inventory`` (default: what ``config.cluster`` declares).

    ``policy`` overrides the configured placement policy (used to test what
    another policy would do). Raises ConfigError with every reason when the
    deployment cannot work.
    """
    plugins = plugins if plugins is not None else get_plugins()
    if inventory is None:
        inventory = inventory_from_cluster(config.cluster)
    settings_problems = check_engine_settings(config)
    if settings_problems:  # no placement policy changes these: report them alone
        raise _settings_error(config, settings_problems)
    name = policy or effective_policy(config)
    chosen = plugins.policy(name)
    try:
        return _plan(config, inventory, plugins, name, chosen)
    except Infeasible as exc:
        raise _error(config, inventory, plugins, name, exc.refusals) from None


def _plan(
    config: PipelineConfig,
    inventory: GpuInventory,
    plugins: Any,
    name: str,
    policy: PlacementPolicy,
) -> DeploymentPlan:
    expansion = expand(config)
    estimates = collect_estimates(config, plugins) if policy.uses_estimates else {}
    request = PlacementRequest(
        pipeline=type(config).pipeline_name,
        instances=tuple(expansion.instances),
        inventory=inventory,
        memory_limit=config.placement.memory_limit,
        estimates=estimates,
    )
    problems = list(expansion.problems)
    problems += [  # tp_size where nothing runs it (the CLI says who wrote it, in config checks)
        Refusal(message, stage=paths[0][1], fix=fix)
        for paths, message, fix in config.tensor_parallel_problems()
    ]
    result = policy.place(request)
    problems += result.refusals
    if problems:
        raise Infeasible(problems)

    assignments = result.assignments
    problems += check_assignments(request, assignments)
    if any(i.name not in assignments for i in request.instances):
        raise Infeasible(problems)  # nothing further can be checked without every instance
    problems += check_processes(request, assignments)
    ledger = gpu_ledger(request.instances, assignments, inventory)
    gpu_problems, notes = check_gpus(request, assignments, ledger)
    problems += gpu_problems
    processes, stages, process_problems = build_processes(expansion, assignments)
    problems += process_problems
    nodes = assign_nodes(config, processes, inventory, problems)
    edges = plan_edges(config, processes, stages)
    stage_of = {i.name: i.stage for i in request.instances}
    precisions = plan_precisions(config, assignments, stage_of, inventory, problems)
    running: dict[str, int] = {}  # engine.max_running_requests the plan sizes from memory
    caches = plan_caches(
        config, assignments, stage_of, inventory, estimates, plugins, problems, running
    )
    decodes = plan_decodes(config, assignments, stage_of, precisions, running)
    problems += check_cross_node(config, edges, plugins)
    engines = {name for name, group in expansion.members.items() if any(s.is_engine for s in group)}
    plan_cpu_threads(processes, engines, config.runtime.cpu_threads)
    plan_huge_pages(processes)
    if not estimates and config.weight_share == "on":  # counted once, never placed by
        estimates = sharing_estimates(config, plugins)
    weight_share = plan_weight_share(
        config.weight_share, processes, expansion.members, problems, estimates
    )
    mps = plan_mps(config.mps, ledger, inventory, problems)
    endpoints = plan_endpoints(config, processes, stages, problems)
    problems += check_transports(config, processes, plugins)
    if problems:
        raise Infeasible(problems)

    notes = [*result.notes, *notes, *weight_share.notes, *mps.notes]
    checked = estimates or _estimates_if_needed(config, plugins, ledger)
    if running and checked:  # what the stages hold with the requests the plan sized
        resized = _estimates_if_needed(with_sized_requests(config, running), plugins, ledger)
        checked = resized or checked
        if estimates:  # the plan prints these: the same numbers as the warning's
            estimates = checked
    notes += headroom_notes(
        ledger,
        {i.name: i for i in request.instances},
        assignments,
        checked,
        request.memory_limit,
    )
    compiling = compile_startup_note(config, decodes)
    if compiling is not None:
        notes.append(compiling)
    if not inventory.count_known and ledger:
        notes.append(
            "the GPU inventory is unknown, so GPU ids were not checked "
            "(declare it with --gpus N --gpu-memory SIZE)"
        )
    return DeploymentPlan(
        pipeline=type(config).pipeline_name,
        model_path=config.model_path,
        policy=name,
        inventory=inventory,
        stages=stages,
        processes=processes,
        gpus=ledger,
        replicas=expansion.stage_instances,
        process_replicas=expansion.process_instances,
        weight_share=weight_share,
        mps=mps,
        endpoints=endpoints,
        start_waves=start_waves(processes),
        estimates=dict(estimates),
        precisions=precisions,
        decodes=decodes,
        prefills=plan_prefills(config, set(stage_of.values())),
        caches=caches,
        running_requests=running,
        notes=notes,
        edges=edges,
        nodes=nodes,
        admission_limit=admission_limit(
            config, {p: len(r) for p, r in expansion.process_instances.items()}, running
        ),
    )


def _estimates_if_needed(
    config: PipelineConfig, plugins: Any, ledger: Mapping[int, Any]
) -> dict[str, MemoryEstimate]:
    """The plugins' estimates where a GPU of known memory is there to check them against
    (a declared placement asks none for placing); none where a plugin cannot answer."""
    if not any(plan.memory_bytes for plan in ledger.values()):
        return {}
    try:
        return collect_estimates(config, plugins)
    except OmniError:
        return {}


def _alternatives(
    config: PipelineConfig, inventory: GpuInventory, plugins: Any, failed: str
) -> list[str]:
    """Other registered policies that would plan this deployment as configured.

    ``cpu`` always would, so it is offered only where there is no GPU at all.
    """
    found = []
    for other in sorted(plugins.registries.policies):
        if other == failed or (other == "cpu" and inventory.count != 0):
            continue
        try:
            _plan(config, inventory, plugins, other, plugins.policy(other))
        except Exception:  # infeasible, or a plugin policy that breaks: not an alternative
            continue
        found.append(other)
    return found


def _settings_error(config: PipelineConfig, refusals: list[Refusal]) -> ConfigError:
    count = len(refusals)
    lines = [
        f"cannot plan pipeline {type(config).pipeline_name!r}: {count} engine setting"
        f"{'s' if count != 1 else ''} refused"
    ]
    lines += [f"  - {r.message}" for r in refusals]
    fixes = [r.fix for r in refusals if r.fix]
    return ConfigError("\n".join(lines), hint="\n        ".join(fixes) or None)


def _error(
    config: PipelineConfig,
    inventory: GpuInventory,
    plugins: Any,
    policy: str,
    refusals: list[Refusal],
) -> ConfigError:
    count = len(refusals)
    lines = [
        f"cannot plan pipeline {type(config).pipeline_name!r} with placement policy "
        f"{policy!r}: {count} problem{'s' if count != 1 else ''}"
    ]
    lines += [f"  - {r.message}" for r in refusals]
    fixes: list[str] = []
    for refusal in refusals:
        if refusal.fix and refusal.fix not in fixes:
            fixes.append(refusal.fix)
    others = _alternatives(config, inventory, plugins, policy)
    if others:
        fixes.append(
            f"placement polic{'ies' if len(others) > 1 else 'y'} {', '.join(others)} would plan "
            f'this deployment as configured: [placement] policy = "{others[0]}" '
            f"(or --placement.policy {others[0]})"
        )
    else:
        fixes.append("no other placement policy plans this deployment as configured")
    return ConfigError("\n".join(lines), hint="\n        ".join(fixes))
