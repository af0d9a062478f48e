"""The GPUs a deployment is planned against, as a placement policy sees them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..schema.sizes import format_bytes


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
class ClusterNode:
    """One machine of a multi-node inventory: its name, GPU count, and where it is.

    ``first_gpu`` is the cluster id of its first GPU: cluster GPU ids count the
    nodes' GPUs in node order, so a placement policy sees one flat list.
    ``node_id`` and ``address`` are known for a live cluster only.
    """

    name: str
    gpus: int = 0
    first_gpu: int = 0
    cpus: float | None = None
    node_id: str | None = None
    address: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpus": self.gpus,
            "first_gpu": self.first_gpu,
            "cpus": self.cpus,
            "node_id": self.node_id,
            "address": self.address,
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
    nodes: tuple[ClusterNode, ...] = ()

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

    def node_of(self, gpu: int) -> tuple[ClusterNode, int] | None:
        """The node holding cluster GPU ``gpu``, and its id on that node."""
        for node in self.nodes:
            if node.first_gpu <= gpu < node.first_gpu + node.gpus:
                return node, gpu - node.first_gpu
        return None

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
            on = f" on {len(self.nodes)} nodes" if len(self.nodes) > 1 else ""
            return f"no GPUs{on} (from {self.source})"
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
        where = ""
        if self.nodes:
            where = (
                f" on {len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''} ("
                + ", ".join(f"{node.name}: {node.gpus}" for node in self.nodes)
                + ")"
            )
        return f"{n} GPU{'s' if n != 1 else ''}{where} ({ids}, {memory}; from {self.source})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "count": self.count,
            "mps_available": self.mps_available,
            "devices": [d.to_dict() for d in self.devices],
            "nodes": [n.to_dict() for n in self.nodes],
            "notes": list(self.notes),
        }
