"""The plain data of a plan: the :class:`DeploymentPlan` the planner hands to
``omni plan`` and the runtime, and its parts. What a placement policy receives
and returns is the placement contract's (:mod:`omni_core.placement`), imported
here because a plan is made of it.

These are dataclasses, not pydantic models: the config was validated when it
was resolved, and planning builds these objects in loops over every stage
instance (thousands in the benchmark), where validation would only cost time.
Every plan object has ``to_dict()``: JSON-ready, with a deterministic order, so
two runs of ``omni plan --json`` on one deployment are byte-identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..placement import (  # noqa: F401 - re-exported: the plan's own vocabulary
    Assignment,
    ClusterNode,
    GpuDevice,
    GpuInventory,
    MemoryEstimate,
    PlacementRequest,
    PlacementResult,
    Refusal,
    StageInstance,
)

_ROUND = 6  # digits kept for memory fractions: 0.03 + 0.78 + ... prints as 0.94


def round_fraction(value: float | None) -> float | None:
    """Fractions as people wrote them, without binary floating-point tails."""
    return None if value is None else round(value, _ROUND)


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
    gpu_memory_fraction: float | None
    total_reserve_bytes: int | None
    share_source: str
    tp_processes: tuple[str, ...] = ()
    endpoint: str | None = None
    # engine.mem_fraction_static of an engine stage that declares no share: how it sizes itself
    engine_memory_fraction: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "stage": self.stage,
            "process": self.process,
            "tp_processes": list(self.tp_processes),
            "replica": self.replica,
            "tp_size": self.tp_size,
            "gpus": list(self.gpus),
            "gpu_memory_fraction": round_fraction(self.gpu_memory_fraction),
            "total_reserve_bytes": self.total_reserve_bytes,
            "share_source": self.share_source,
            "engine_memory_fraction": round_fraction(self.engine_memory_fraction),
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
    # Tensor-parallel ranks the stage's engine starts itself inside this one process
    # (SGLang's scheduler processes, on consecutive GPUs from ``gpu``); 0: none.
    engine_ranks: int = 0
    env: dict[str, str] = field(default_factory=dict)
    gpu_memory_fraction: float | None = None
    total_reserve_bytes: int | None = None
    endpoint: str = ""
    start_wave: int = 0
    weight_share: str = "none"
    node: str | None = None  # multi-node plans: the node's name, and the GPU's id there
    node_gpu: int | None = None
    cpu_threads: int | None = None  # torch threads (plan/threads.py), and why that many
    threads_source: str = ""

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
            "engine_ranks": self.engine_ranks,
            "leader": self.leader,
            "env": dict(sorted(self.env.items())),
            "gpu_memory_fraction": round_fraction(self.gpu_memory_fraction),
            "total_reserve_bytes": self.total_reserve_bytes,
            "endpoint": self.endpoint,
            "start_wave": self.start_wave,
            "weight_share": self.weight_share,
            "node": self.node,
            "node_gpu": self.node_gpu,
            "cpu_threads": self.cpu_threads,
            "threads_source": self.threads_source,
        }


@dataclass
class GpuPlan:
    """What one GPU holds: stages, processes, and how much memory is promised."""

    gpu: int
    memory_bytes: int | None
    stages: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    gpu_memory_fraction_sum: float = 0.0
    total_reserve_bytes_sum: int = 0
    # engine stages without a declared share that size themselves: instance -> fraction
    engine_memory_fractions: dict[str, float] = field(default_factory=dict)
    undeclared_stages: list[str] = field(default_factory=list)

    @property
    def engine_fraction_sum(self) -> float:
        return round_fraction(sum(self.engine_memory_fractions.values())) or 0.0

    @property
    def committed(self) -> float | None:
        """Declared fractions, reserved bytes as a fraction and the engines' own fractions;
        None when bytes meet unknown memory."""
        if self.total_reserve_bytes_sum and not self.memory_bytes:
            return None
        extra = self.total_reserve_bytes_sum / self.memory_bytes if self.memory_bytes else 0.0
        return self.gpu_memory_fraction_sum + extra + self.engine_fraction_sum

    def to_dict(self) -> dict[str, Any]:
        return {
            "memory_bytes": self.memory_bytes,
            "stages": list(self.stages),
            "processes": list(self.processes),
            "gpu_memory_fraction_sum": round_fraction(self.gpu_memory_fraction_sum),
            "total_reserve_bytes_sum": self.total_reserve_bytes_sum,
            "engine_memory_fractions": {
                name: round_fraction(value)
                for name, value in sorted(self.engine_memory_fractions.items())
            },
            "committed_fraction": round_fraction(self.committed),
            "undeclared_stages": list(self.undeclared_stages),
        }


@dataclass
class WeightShareGroup:
    """Replicas of one process on one GPU (``gpu`` None: on the host) that load weights once.

    ``weights_bytes``: one copy of the process's weights, from the plugins'
    estimates (None when there are none); the followers' copies are saved.
    """

    process: str
    gpu: int | None
    stage: str
    leader: str
    followers: list[str]
    weights_bytes: int | None = None

    @property
    def saved_bytes(self) -> int | None:
        return None if self.weights_bytes is None else self.weights_bytes * len(self.followers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "gpu": self.gpu,
            "stage": self.stage,
            "leader": self.leader,
            "followers": list(self.followers),
            "weights_bytes": self.weights_bytes,
            "saved_bytes": self.saved_bytes,
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
class EdgePlan:
    """One edge of the stage graph and what carries it.

    ``transport`` is None when both stages share a process (payloads pass as
    Python objects); ``stream`` marks a ``stream_to`` edge, whose chunks flow
    while the source still runs. Replicas of a stage share its edges.
    """

    source: str
    target: str
    stream: bool
    transport: str | None
    links: list[LinkPlan] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "stream": self.stream,
            "transport": self.transport,
            "links": [link.to_dict() for link in self.links],
        }


@dataclass
class LinkPlan:
    """One process sending an edge's payloads to another, and the transport between them."""

    source: str
    target: str
    transport: str
    cross_node: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "target": self.target,
            "transport": self.transport,
            "cross_node": self.cross_node,
        }


@dataclass
class NodesPlan:
    """Which node each process runs on, for a multi-node inventory.

    ``coordinator`` is the node ``omni serve`` runs on (the first node), where
    requests enter and results leave.
    """

    strategy: str
    coordinator: str
    nodes: list[ClusterNode]
    processes: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "coordinator": self.coordinator,
            "nodes": [
                {**n.to_dict(), "processes": list(self.processes.get(n.name, []))}
                for n in self.nodes
            ],
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
    # stage -> engine.precision.Precision: the weights' dtype (and quantization), and why
    precisions: dict[str, Any] = field(default_factory=dict)
    # torch engine stage -> how it decodes (eager, compiled, CUDA graphs, prepacked), in words
    decodes: dict[str, str] = field(default_factory=dict)
    # torch engine stage -> its prompt budget a step and where longer prompts go, in words
    prefills: dict[str, str] = field(default_factory=dict)
    # torch engine stage on a GPU -> how its KV cache will be sized from its share, in words
    caches: dict[str, str] = field(default_factory=dict)
    # torch engine stage on a GPU -> the engine.max_running_requests the plan sized from
    # memory (deploy file silent): what its engine runs and admission counts (plan/caches.py)
    running_requests: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    edges: list[EdgePlan] = field(default_factory=list)
    nodes: NodesPlan | None = None
    admission_limit: int = 0  # requests in flight the runtime admits (plan/admission.py)

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
            "edges": [e.to_dict() for e in self.edges],
            "nodes": self.nodes.to_dict() if self.nodes else None,
            "estimates": {k: self.estimates[k].to_dict() for k in sorted(self.estimates)},
            "precisions": {k: self.precisions[k].to_dict() for k in sorted(self.precisions)},
            "decodes": {k: self.decodes[k] for k in sorted(self.decodes)},
            "prefills": {k: self.prefills[k] for k in sorted(self.prefills)},
            "caches": {k: self.caches[k] for k in sorted(self.caches)},
            "running_requests": dict(sorted(self.running_requests.items())),
            "notes": list(self.notes),
            "admission_limit": self.admission_limit,
        }
