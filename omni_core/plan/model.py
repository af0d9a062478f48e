"""The plain data of planning: what a placement policy receives, what it returns,
and the :class:`DeploymentPlan` the planner hands to ``omni plan`` and the runtime.

These are dataclasses, not pydantic models: the config was validated when it
was resolved, and planning builds these objects in loops over every stage
instance (thousands in the benchmark), where validation would only cost time.
Every plan object has ``to_dict()``: JSON-ready, with a deterministic order, so
two runs of ``omni plan --json`` on one deployment are byte-identical.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..schema.sizes import format_bytes

_ROUND = 6  # digits kept for memory fractions: 0.03 + 0.78 + ... prints as 0.94


def round_fraction(value: float | None) -> float | None:
    """Fractions as people wrote them, without binary floating-point tails."""
    return None if value is None else round(value, _ROUND)


# -- the GPU inventory -------------------------------------------------------


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as detected or declared. ``None`` means not known."""

    index: int
    memory_bytes: int | None = None
    uuid: str | None = None
    name: str | None = None
    free_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "memory_bytes": self.memory_bytes,
            "free_bytes": self.free_bytes,
            "uuid": self.uuid,
            "name": self.name,
        }


@dataclass(frozen=True)
class GpuInventory:
    """The GPUs a deployment is planned against.

    ``count_known`` is False when nothing could be detected and nothing was
    declared: then GPU ids cannot be checked, and policies that must know the
    GPUs (``auto``) refuse. ``mps_available`` is whether the MPS control binary
    is present (None: unknown). ``source`` says where the facts came from
    (``nvml``, ``config``, ``nvml+config``, ``unknown``) so a plan printed on a
    laptop says it was planned for declared hardware.
    """

    devices: tuple[GpuDevice, ...] = ()
    count_known: bool = False
    mps_available: bool | None = None
    source: str = "unknown"
    notes: tuple[str, ...] = ()

    @classmethod
    def unknown(cls, note: str | None = None) -> GpuInventory:
        return cls(notes=(note,) if note else ())

    @classmethod
    def uniform(
        cls,
        count: int,
        memory_bytes: int | None = None,
        *,
        mps_available: bool | None = None,
        source: str = "config",
    ) -> GpuInventory:
        """``count`` identical GPUs: how a user describes hardware they are not on."""
        devices = tuple(GpuDevice(i, memory_bytes) for i in range(count))
        return cls(devices, True, mps_available, source)

    @property
    def count(self) -> int | None:
        return len(self.devices) if self.count_known else None

    def has(self, gpu: int) -> bool:
        """Whether ``gpu`` exists; every id is accepted when the count is unknown."""
        return not self.count_known or 0 <= gpu < len(self.devices)

    def memory_of(self, gpu: int) -> int | None:
        if 0 <= gpu < len(self.devices):
            return self.devices[gpu].memory_bytes
        return None

    def describe(self) -> str:
        """``2 GPUs (ids 0-1, 80GiB each; from config)`` and the like."""
        if not self.count_known:
            return "unknown (no GPU detected or declared)"
        n = len(self.devices)
        if n == 0:
            return f"no GPUs (from {self.source})"
        ids = "id 0" if n == 1 else f"ids 0-{n - 1}"
        sizes = {d.memory_bytes for d in self.devices}
        if sizes == {None}:
            memory = "memory unknown"
        elif len(sizes) == 1:
            memory = f"{format_bytes(next(iter(sizes)))} each"  # type: ignore[arg-type]
        else:
            memory = ", ".join(
                f"GPU {d.index} {format_bytes(d.memory_bytes) if d.memory_bytes else '?'}"
                for d in self.devices
            )
        return f"{n} GPU{'s' if n != 1 else ''} ({ids}, {memory}; from {self.source})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "count": self.count,
            "mps_available": self.mps_available,
            "devices": [d.to_dict() for d in self.devices],
            "notes": list(self.notes),
        }


# -- memory estimates ----------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    """GPU memory one stage needs, summed over its tensor-parallel ranks.

    ``weights_bytes`` by the dtype the stage loads in; ``kv_bytes`` the engine's
    KV-cache budget (0 for stages without one); ``overhead_bytes`` activations,
    workspaces and CUDA graphs. ``source`` says how it was estimated, for the
    plan's reader.
    """

    weights_bytes: int
    kv_bytes: int = 0
    overhead_bytes: int = 0
    source: str = ""

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights_bytes": self.weights_bytes,
            "kv_bytes": self.kv_bytes,
            "overhead_bytes": self.overhead_bytes,
            "total_bytes": self.total_bytes,
            "source": self.source,
        }


# -- what a placement policy receives ----------------------------------------


@dataclass(frozen=True)
class StageInstance:
    """One stage of one replica: what a placement policy places.

    ``gpus`` is what the deployment asked for (the stage's ``gpu``, or the
    replica's slice of ``replica_devices`` when ``device_source`` says so);
    empty for a host stage. A policy may honour or override it.
    """

    name: str
    stage: str
    process: str
    logical_process: str
    replica: int = 0
    num_replicas: int = 1
    tp_size: int = 1
    is_engine: bool = False
    uses_gpu: bool = False
    gpus: tuple[int, ...] = ()
    device_source: str = "stage"
    memory_fraction: float | None = None
    reserve_bytes: int | None = None

    @property
    def declares_share(self) -> bool:
        return self.memory_fraction is not None or self.reserve_bytes is not None


@dataclass(frozen=True)
class PlacementRequest:
    """Everything a policy may look at; it must not look anywhere else.

    ``instances`` are in declaration order (stages), replicas inner.
    ``estimates`` holds per logical stage what the model plugins estimate, and
    is filled only for policies that set ``uses_estimates = True``.
    """

    pipeline: str
    instances: tuple[StageInstance, ...]
    inventory: GpuInventory
    memory_limit: float = 1.0
    estimates: Mapping[str, MemoryEstimate] = field(default_factory=dict)

    def processes(self) -> dict[str, list[StageInstance]]:
        """Instances by process instance, in order of first appearance."""
        groups: dict[str, list[StageInstance]] = {}
        for instance in self.instances:
            groups.setdefault(instance.process, []).append(instance)
        return groups

    def gpu_instances(self) -> list[StageInstance]:
        return [i for i in self.instances if i.uses_gpu]


# -- what a placement policy returns -------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """One reason a deployment cannot be planned, and what would fix it.

    ``stage`` and ``gpu`` say what the reason is about (for grouping and
    tests); ``fix`` is a concrete change (a flag, a setting) or None.
    """

    message: str
    stage: str | None = None
    gpu: int | None = None
    fix: str | None = None


@dataclass(frozen=True)
class Assignment:
    """Where one stage instance runs and the memory it may take on each of its GPUs.

    ``gpus`` empty means the host (no GPU). ``memory_fraction`` is per GPU;
    ``reserve_bytes`` is an absolute budget per GPU; set one of them at most
    (the checks refuse both, as the schema does for a stage). ``share_source`` says where
    the share came from: ``declared`` (the config), ``estimate`` (a policy
    computed it) or ``none``.
    """

    instance: str
    gpus: tuple[int, ...] = ()
    memory_fraction: float | None = None
    reserve_bytes: int | None = None
    share_source: str = "none"


@dataclass
class PlacementResult:
    """A policy's answer: one assignment per instance, or refusals."""

    assignments: dict[str, Assignment] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def assign(self, assignment: Assignment) -> None:
        self.assignments[assignment.instance] = assignment

    def refuse(self, message: str, **about: Any) -> None:
        self.refusals.append(Refusal(message, **about))


# -- the plan ------------------------------------------------------------------


@dataclass
class StagePlacement:
    """One stage instance in the plan."""

    instance: str
    stage: str
    process: str
    replica: int
    tp_size: int
    gpus: tuple[int, ...]
    memory_fraction: float | None
    reserve_bytes: int | None
    share_source: str
    tp_processes: tuple[str, ...] = ()
    endpoint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "stage": self.stage,
            "process": self.process,
            "tp_processes": list(self.tp_processes),
            "replica": self.replica,
            "tp_size": self.tp_size,
            "gpus": list(self.gpus),
            "memory_fraction": round_fraction(self.memory_fraction),
            "reserve_bytes": self.reserve_bytes,
            "share_source": self.share_source,
            "endpoint": self.endpoint,
        }


@dataclass
class ProcessPlan:
    """One OS process: its stages (instance names), its GPU, its place in start-up."""

    name: str
    logical: str
    stages: tuple[str, ...]
    gpu: int | None
    replica: int = 0
    num_replicas: int = 1
    tp_rank: int | None = None
    tp_size: int = 1
    env: dict[str, str] = field(default_factory=dict)
    memory_fraction: float | None = None
    reserve_bytes: int | None = None
    endpoint: str = ""
    start_wave: int = 0
    weight_share: str = "none"

    @property
    def leader(self) -> bool:
        """Rank 0 of a tensor-parallel group (and every non-TP process) leads."""
        return not self.tp_rank

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "logical": self.logical,
            "stages": list(self.stages),
            "gpu": self.gpu,
            "replica": self.replica,
            "num_replicas": self.num_replicas,
            "tp_rank": self.tp_rank,
            "tp_size": self.tp_size,
            "leader": self.leader,
            "env": dict(sorted(self.env.items())),
            "memory_fraction": round_fraction(self.memory_fraction),
            "reserve_bytes": self.reserve_bytes,
            "endpoint": self.endpoint,
            "start_wave": self.start_wave,
            "weight_share": self.weight_share,
        }


@dataclass
class GpuPlan:
    """What one GPU holds: stages, processes, and how much memory is promised."""

    gpu: int
    memory_bytes: int | None
    stages: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    memory_fraction_total: float = 0.0
    reserve_bytes_total: int = 0
    undeclared_stages: list[str] = field(default_factory=list)

    @property
    def committed(self) -> float | None:
        """Fractions plus reserved bytes as a fraction; None when bytes meet unknown memory."""
        if self.reserve_bytes_total and not self.memory_bytes:
            return None
        extra = self.reserve_bytes_total / self.memory_bytes if self.memory_bytes else 0.0
        return self.memory_fraction_total + extra

    def to_dict(self) -> dict[str, Any]:
        return {
            "memory_bytes": self.memory_bytes,
            "stages": list(self.stages),
            "processes": list(self.processes),
            "memory_fraction_total": round_fraction(self.memory_fraction_total),
            "reserve_bytes_total": self.reserve_bytes_total,
            "committed_fraction": round_fraction(self.committed),
            "undeclared_stages": list(self.undeclared_stages),
        }


@dataclass
class WeightShareGroup:
    """Replicas of one process on one GPU that load the engine's weights once."""

    process: str
    gpu: int
    stage: str
    leader: str
    followers: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "gpu": self.gpu,
            "stage": self.stage,
            "leader": self.leader,
            "followers": list(self.followers),
        }


@dataclass
class WeightSharePlan:
    mode: str = "off"
    groups: list[WeightShareGroup] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def role_of(self, process: str) -> str:
        for group in self.groups:
            if group.leader == process:
                return "leader"
            if process in group.followers:
                return "follower"
        return "none"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "groups": [g.to_dict() for g in self.groups],
            "notes": list(self.notes),
        }


@dataclass
class MpsDecision:
    enabled: bool
    clients: list[str]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "clients": list(self.clients), "reason": self.reason}


@dataclass
class MpsPlan:
    mode: str = "off"
    gpus: dict[int, MpsDecision] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "gpus": {str(g): self.gpus[g].to_dict() for g in sorted(self.gpus)},
            "notes": list(self.notes),
        }


@dataclass
class EndpointsPlan:
    """Where the runtime will create its Unix sockets (planning creates nothing)."""

    base_path: str
    deployment_id: str
    runtime_dir: str
    coordinator: str
    processes: dict[str, str] = field(default_factory=dict)
    stages: dict[str, str] = field(default_factory=dict)
    mode: int = 0o700

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_path": self.base_path,
            "deployment_id": self.deployment_id,
            "runtime_dir": self.runtime_dir,
            "mode": f"{self.mode:04o}",
            "coordinator": self.coordinator,
            "processes": dict(self.processes),
            "stages": dict(self.stages),
        }


@dataclass
class DeploymentPlan:
    """Everything decided before a child process starts. Pure data."""

    pipeline: str
    model_path: str
    policy: str
    inventory: GpuInventory
    stages: list[StagePlacement]
    processes: list[ProcessPlan]
    gpus: dict[int, GpuPlan]
    replicas: dict[str, list[str]]
    process_replicas: dict[str, list[str]]
    weight_share: WeightSharePlan
    mps: MpsPlan
    endpoints: EndpointsPlan
    start_waves: list[list[str]]
    estimates: dict[str, MemoryEstimate] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def process(self, name: str) -> ProcessPlan:
        for process in self.processes:
            if process.name == name:
                return process
        raise KeyError(name)

    def stage(self, instance: str) -> StagePlacement:
        for stage in self.stages:
            if stage.instance == instance:
                return stage
        raise KeyError(instance)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "model_path": self.model_path,
            "policy": self.policy,
            "inventory": self.inventory.to_dict(),
            "processes": [p.to_dict() for p in self.processes],
            "stages": [s.to_dict() for s in self.stages],
            "gpus": {str(g): self.gpus[g].to_dict() for g in sorted(self.gpus)},
            "replicas": {k: list(v) for k, v in self.replicas.items()},
            "process_replicas": {k: list(v) for k, v in self.process_replicas.items()},
            "weight_share": self.weight_share.to_dict(),
            "mps": self.mps.to_dict(),
            "endpoints": self.endpoints.to_dict(),
            "start_waves": [list(w) for w in self.start_waves],
            "estimates": {k: self.estimates[k].to_dict() for k in sorted(self.estimates)},
            "notes": list(self.notes),
        }
