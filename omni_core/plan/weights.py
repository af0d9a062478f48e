"""Weight sharing: replicas of one process on one device load the weights once.

With ``weight_share = "on"``, the replicas of a process that land on the same
GPU, or on the host (CPU replicas), form a sharing group: the lowest replica
index leads (loads the checkpoint and publishes it), the others follow (map
the leader's tensors). Followers start in a later wave than leaders. The
group's weights are counted once: ``weights_bytes`` is one copy (from the
plugins' estimates), ``saved_bytes`` what the followers do not load. Only the
plan and its checks live here; the mechanism belongs to the runtime
(:mod:`omni_core.runtime.weight_share`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import PluginError
from ..schema import StageConfig
from .estimates import collect_estimates
from .model import MemoryEstimate, ProcessPlan, Refusal, WeightShareGroup, WeightSharePlan


def plan_weight_share(
    mode: str,
    processes: list[ProcessPlan],
    members: dict[str, list[StageConfig]],
    problems: list[Refusal],
    estimates: Mapping[str, MemoryEstimate] | None = None,
) -> WeightSharePlan:
    """Sharing groups and their leaders; sets each process's role and start wave."""
    plan = WeightSharePlan(mode=mode)
    estimates = estimates or {}
    if mode != "on":
        return plan
    before = len(problems)
    by_gpu: dict[str, dict[int | None, list[ProcessPlan]]] = {}  # None: the host
    replicated: dict[str, list[ProcessPlan]] = {}
    for process in processes:
        if process.num_replicas < 2:
            continue
        replicated.setdefault(process.logical, []).append(process)
        if process.tp_rank is not None:
            continue
        by_gpu.setdefault(process.logical, {}).setdefault(process.gpu, []).append(process)
    for logical, replicas in replicated.items():
        if replicas[0].tp_rank is not None:
            plan.notes.append(
                f"process {logical!r} is tensor-parallel: its replicas load their own shards "
                "(weight sharing skipped)"
            )
    for logical, gpus in by_gpu.items():
        shared = {gpu: group for gpu, group in gpus.items() if len(group) > 1}
        if not shared:
            continue
        on_host = None in shared
        engines = [
            s.name for s in members[logical] if s.is_engine and (on_host or s.gpu is not None)
        ]
        if len(engines) != 1:
            problems.append(
                Refusal(
                    f"weight_share: process {logical!r} has "
                    + (
                        "no engine stage"
                        if not engines
                        else f"several engine stages ({', '.join(engines)})"
                    )
                    + "; weight sharing shares the weights of exactly one engine stage",
                    stage=members[logical][0].name,
                    fix="set weight_share = off, or share only processes with one engine stage",
                )
            )
            continue
        copy = [estimates[s.name].weights_bytes for s in members[logical] if s.name in estimates]
        for gpu, group in sorted(shared.items(), key=lambda item: (item[0] is None, item[0])):
            ordered = sorted(group, key=lambda p: p.replica)
            plan.groups.append(
                WeightShareGroup(
                    process=logical,
                    gpu=gpu,
                    stage=engines[0],
                    leader=ordered[0].name,
                    followers=[p.name for p in ordered[1:]],
                    weights_bytes=sum(copy) if copy else None,
                )
            )
    if not plan.groups and len(problems) == before:
        detail = "; ".join(
            f"{logical}: GPUs {[p.gpu for p in reps if p.tp_rank in (None, 0)]}"
            for logical, reps in replicated.items()
        )
        problems.append(
            Refusal(
                "weight_share = on, but no two replicas of one process share a GPU"
                + (f" ({detail})" if detail else " (no process has replicas)"),
                fix="set weight_share = off, or put replicas on one GPU "
                "(processes.NAME.replica_devices = [0, 0])",
            )
        )
    for process in processes:
        process.weight_share = plan.role_of(process.name)
        process.start_wave = 1 if process.weight_share == "follower" else 0
    return plan


def sharing_estimates(config: Any, plugins: Any) -> dict[str, MemoryEstimate]:
    """The plugins' memory estimates, to count a sharing group's weights once.

    Only reported (placement did not ask for them): a plugin that fails to
    estimate costs the count, never the plan.
    """
    try:
        return collect_estimates(config, plugins)
    except PluginError:
        return {}


def start_waves(processes: list[ProcessPlan]) -> list[list[str]]:
    """Processes by start-up wave: leaders (and everyone else) first, followers after."""
    waves: dict[int, list[str]] = {}
    for process in processes:
        waves.setdefault(process.start_wave, []).append(process.name)
    return [waves[w] for w in sorted(waves)]
