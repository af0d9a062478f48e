"""What a placement policy receives: the stage instances, the GPUs, the estimates.

A policy must look at nothing else, so that ``omni plan`` is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .inventory import GpuInventory


@dataclass(frozen=True)
class MemoryEstimate:
    """GPU memory one stage needs, summed over its tensor-parallel ranks.

    ``weights_bytes`` by the dtype the stage loads in; ``kv_bytes`` the engine's
    KV-cache budget (0 for stages without one); ``overhead_bytes`` activations,
    workspaces and CUDA graphs. ``source`` says how it was estimated, for the
    plan's reader. ``kv_bytes_per_token``: what one cache position costs (0:
    unknown), so that the plan can say how many positions a memory share holds;
    ``max_positions``: the model's ``max_position_embeddings`` (None: unknown),
    the most one cache slot takes.
    """

    weights_bytes: int
    kv_bytes: int = 0
    overhead_bytes: int = 0
    source: str = ""
    kv_bytes_per_token: int = 0
    max_positions: int | None = None

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
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "max_positions": self.max_positions,
        }


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
    gpu_memory_fraction: float | None = None
    total_reserve_bytes: int | None = None
    # An engine stage's own sizing (engine.mem_fraction_static): not a placement share,
    # but the memory it will take of its GPU when it declares none.
    engine_memory_fraction: float | None = None

    @property
    def declares_share(self) -> bool:
        return self.gpu_memory_fraction is not None or self.total_reserve_bytes is not None


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
