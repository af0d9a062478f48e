"""Process groups: which stage instances share an OS process, and on which GPU.

Stages with one ``process`` name share one OS process and one event loop:
payloads pass as Python objects, but one stage's crash takes the process
down and GPU start-up inside it is serialised. A tensor-parallel stage gets
one process per rank (``<process>_tp<rank>``, rank 0 leads), unless its engine
backend starts the ranks itself (SGLang: one process, ``engine_ranks``). A process has one
environment, so its stages' ``env`` defaults must agree.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..schema import StageConfig
from ..schema.tensor_parallel import engine_runs_ranks
from .expand import Expansion, tp_process_name
from .model import (
    Assignment,
    ProcessPlan,
    Refusal,
    StageInstance,
    StagePlacement,
    round_fraction,
)


def merged_env(process: str, stages: list[StageConfig], problems: list[Refusal]) -> dict[str, str]:
    """The env defaults of a process; two stages disagreeing on a key is a problem."""
    env: dict[str, str] = {}
    owner: dict[str, str] = {}
    for stage in stages:
        for key, value in stage.env.items():
            if key in env and env[key] != value:
                problems.append(
                    Refusal(
                        f"process {process!r}: stages {owner[key]!r} and {stage.name!r} set env "
                        f"default {key} to different values ({env[key]!r}, {value!r}); "
                        "one process has one environment",
                        stage=stage.name,
                        fix=f"give {key} one value in both stages' env, or put them in "
                        "different processes",
                    )
                )
                continue
            env[key] = value
            owner.setdefault(key, stage.name)
    return env


def build_processes(
    expansion: Expansion, assignments: Mapping[str, Assignment]
) -> tuple[list[ProcessPlan], list[StagePlacement], list[Refusal]]:
    """Processes in order of first appearance, and where each stage instance ended up."""
    problems: list[Refusal] = []
    envs = {p: merged_env(p, stages, problems) for p, stages in expansion.members.items()}
    processes: dict[str, ProcessPlan] = {}
    members: dict[str, list[str]] = {}
    placements: list[StagePlacement] = []
    for instance in expansion.instances:
        assignment = assignments[instance.name]
        ranks = instance.tp_size if instance.tp_size > 1 else 0
        engine_ranks = 0
        if ranks and engine_runs_ranks(expansion.members[instance.logical_process][0]):
            # SGLang's own tensor parallelism: one omni process, whose engine starts the
            # ranks (its scheduler processes) on consecutive GPUs from the first one.
            engine_ranks, ranks = ranks, 0
            _check_consecutive(instance, assignment, problems)
        names = [tp_process_name(instance.process, r) for r in range(ranks)] or [instance.process]
        for rank, name in enumerate(names):
            plan = processes.get(name)
            if plan is None:
                plan = processes[name] = ProcessPlan(
                    name=name,
                    logical=instance.logical_process,
                    stages=(),
                    gpu=None,
                    replica=instance.replica,
                    num_replicas=instance.num_replicas,
                    tp_rank=rank if ranks else None,
                    tp_size=instance.tp_size,
                    engine_ranks=engine_ranks,
                    env=dict(envs[instance.logical_process]),
                )
                members[name] = []
            members[name].append(instance.name)
            if assignment.gpus:
                plan.gpu = assignment.gpus[rank]
                if assignment.gpu_memory_fraction is not None:
                    plan.gpu_memory_fraction = (
                        plan.gpu_memory_fraction or 0.0
                    ) + assignment.gpu_memory_fraction
                if assignment.total_reserve_bytes is not None:
                    plan.total_reserve_bytes = (
                        plan.total_reserve_bytes or 0
                    ) + assignment.total_reserve_bytes
        placements.append(
            StagePlacement(
                instance=instance.name,
                stage=instance.stage,
                process=names[0],
                replica=instance.replica,
                tp_size=instance.tp_size,
                gpus=assignment.gpus,
                gpu_memory_fraction=assignment.gpu_memory_fraction,
                total_reserve_bytes=assignment.total_reserve_bytes,
                share_source=assignment.share_source,
                tp_processes=tuple(names) if ranks else (),
                engine_memory_fraction=_engine_sizing(instance, assignment),
            )
        )
    for name, plan in processes.items():
        plan.stages = tuple(members[name])
        plan.gpu_memory_fraction = round_fraction(plan.gpu_memory_fraction)
    return list(processes.values()), placements, problems


def _check_consecutive(
    instance: StageInstance, assignment: Assignment, problems: list[Refusal]
) -> None:
    """SGLang puts rank r on ``base_gpu_id + r``: the stage's GPUs must be consecutive."""
    gpus = list(assignment.gpus)
    if gpus and gpus != list(range(gpus[0], gpus[0] + len(gpus))):
        problems.append(
            Refusal(
                f"stage {instance.name!r}: tp_size {instance.tp_size} on the sglang backend "
                f"runs SGLang's ranks on GPUs {gpus[0]}..{gpus[0] + len(gpus) - 1} (its "
                f"base_gpu_id plus the rank), but the stage is placed on GPUs {gpus}",
                stage=instance.stage,
                fix=f"give the stage consecutive GPUs (--{instance.stage}.gpu "
                f"'{list(range(gpus[0], gpus[0] + len(gpus)))}')",
            )
        )


def _engine_sizing(instance: StageInstance, assignment: Assignment) -> float | None:
    """The engine's own fraction where it sizes itself: on a GPU, with no declared share."""
    if not assignment.gpus or assignment.gpu_memory_fraction is not None:
        return None
    if assignment.total_reserve_bytes is not None:
        return None
    return instance.engine_memory_fraction
