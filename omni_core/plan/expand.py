"""Replica expansion: logical stages and processes become instances.

``[processes.<name>] num_replicas = N`` turns every member stage ``s`` into
``s@r0 … s@r<N-1>`` running in processes ``<name>@r0 …``; with one replica the
names stay as written (``thinker``, not ``thinker@r0``). A tensor-parallel
stage is one instance per replica here; its per-rank processes
(``<process>_tp<rank>``) are made by :mod:`omni_core.plan.processes`, because
ranks share one placement decision.

``replica_devices`` is checked here too: it is per process, its length must be
``num_replicas x tp_size``, and a process without GPU stages takes none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schema import PipelineConfig, StageConfig
from .model import Refusal, StageInstance


def replica_name(name: str, replica: int, num_replicas: int) -> str:
    """``name@r<i>`` when the process is replicated, ``name`` otherwise."""
    return name if num_replicas == 1 else f"{name}@r{replica}"


def tp_process_name(process: str, rank: int) -> str:
    """The process of one tensor-parallel rank; rank 0 leads."""
    return f"{process}_tp{rank}"


@dataclass
class Expansion:
    """The instances of a deployment and the maps back to logical names."""

    instances: list[StageInstance] = field(default_factory=list)
    stage_instances: dict[str, list[str]] = field(default_factory=dict)
    process_instances: dict[str, list[str]] = field(default_factory=dict)
    members: dict[str, list[StageConfig]] = field(default_factory=dict)
    problems: list[Refusal] = field(default_factory=list)


def group_by_process(config: PipelineConfig) -> dict[str, list[StageConfig]]:
    """Stages by logical process, both in declaration order."""
    members: dict[str, list[StageConfig]] = {}
    for stage in config.stages:
        members.setdefault(stage.process or stage.name, []).append(stage)
    return members


def expand(config: PipelineConfig) -> Expansion:
    """Expand replicas; collect every problem with processes and replica_devices."""
    out = Expansion(members=group_by_process(config))
    plans: dict[str, tuple[int, list[int] | None, int]] = {}
    for process, stages in out.members.items():
        plans[process] = _process_plan(config, process, stages, out.problems)
        num_replicas = plans[process][0]
        out.process_instances[process] = [
            replica_name(process, r, num_replicas) for r in range(num_replicas)
        ]

    for stage in config.stages:
        process = stage.process or stage.name
        num_replicas, devices, tp = plans[process]
        names = out.stage_instances[stage.name] = []
        uses_gpu = stage.gpu is not None
        for replica in range(num_replicas):
            name = replica_name(stage.name, replica, num_replicas)
            names.append(name)
            if uses_gpu and devices is not None:
                gpus = tuple(devices[replica * tp : (replica + 1) * tp])
                source = "replica_devices"
            else:
                gpus = tuple(stage.gpu_ids)
                source = "stage"
            out.instances.append(
                StageInstance(
                    name=name,
                    stage=stage.name,
                    process=replica_name(process, replica, num_replicas),
                    logical_process=process,
                    replica=replica,
                    num_replicas=num_replicas,
                    tp_size=stage.tp_size,
                    is_engine=stage.is_engine,
                    uses_gpu=uses_gpu,
                    gpus=gpus,
                    device_source=source,
                    gpu_memory_fraction=stage.gpu_memory_fraction,
                    total_reserve_bytes=stage.total_reserve_bytes,
                    engine_memory_fraction=_engine_fraction(stage),
                )
            )
    return out


def _engine_fraction(stage: StageConfig) -> float | None:
    """``engine.mem_fraction_static`` of an engine stage, or None."""
    engine = getattr(stage, "engine", None) if stage.is_engine else None
    value = getattr(engine, "mem_fraction_static", None)
    return float(value) if isinstance(value, (int, float)) else None


def _process_plan(
    config: PipelineConfig, process: str, stages: list[StageConfig], problems: list[Refusal]
) -> tuple[int, list[int] | None, int]:
    """(num_replicas, replica_devices if usable, tp_size) of one logical process."""
    settings = config.processes.get(process)
    num_replicas = settings.num_replicas if settings else 1
    devices = settings.replica_devices if settings else None
    tp = max(s.tp_size for s in stages)
    tp_stages = [s.name for s in stages if s.tp_size > 1]
    if tp_stages and len(stages) > 1:
        tp_stage = tp_stages[0]
        others = [s.name for s in stages if s.name != tp_stage]
        if process != tp_stage:
            fix = f"give stage {tp_stage!r} a process of its own (--{tp_stage}.process {tp_stage})"
        else:
            fix = f"move {', '.join(others)} to another process (--{others[0]}.process {others[0]})"
        problems.append(
            Refusal(
                f"stage {tp_stage!r} (tp_size {tp}) shares process {process!r} with "
                f"{', '.join(others)}: a tensor-parallel stage runs alone, one process per rank",
                stage=tp_stage,
                fix=fix,
            )
        )
        return num_replicas, None, tp
    if devices is None:
        return num_replicas, None, tp
    where = f"processes.{process}.replica_devices"
    gpu_stages = [s.name for s in stages if s.gpu is not None]
    if not gpu_stages:
        problems.append(
            Refusal(
                f"{where}: process {process!r} runs no GPU stage "
                f"({', '.join(s.name for s in stages)}), so its replicas take no devices",
                stage=stages[0].name,
                fix=f"remove {where}",
            )
        )
        return num_replicas, None, tp
    want = num_replicas * tp
    if len(devices) != want:
        problems.append(
            Refusal(
                f"{where} lists {len(devices)} GPU id{'s' if len(devices) != 1 else ''} "
                f"{devices} but num_replicas x tp_size = {num_replicas} x {tp} = {want}",
                stage=gpu_stages[0],
                fix=f"write {want} GPU ids in {where}, one per replica"
                + (" and rank" if tp > 1 else ""),
            )
        )
        return num_replicas, None, tp
    for replica in range(num_replicas):
        chunk = devices[replica * tp : (replica + 1) * tp]
        if len(set(chunk)) != len(chunk):
            problems.append(
                Refusal(
                    f"{where}: replica {replica} puts two tensor-parallel ranks on one GPU "
                    f"{chunk}; each rank needs its own GPU",
                    stage=gpu_stages[0],
                    fix=f"give replica {replica} {tp} distinct GPU ids",
                )
            )
            return num_replicas, None, tp
    return num_replicas, list(devices), tp
