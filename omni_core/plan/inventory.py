"""The GPU inventory: detected through NVML where a driver answers, declared otherwise.

Detection is the only impure step of planning, so it is kept out of
:func:`~omni_core.plan.planner.plan_deployment`: the CLI detects, applies the
deploy file's ``[cluster]`` overrides and passes the result in; tests pass an
inventory they built. The NVML module is a parameter (default: ``pynvml`` from
the ``nvidia-ml-py`` package), so detection is tested with a small fake module
and never needs a GPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from ..schema.deployment import ClusterConfig
from .model import ClusterNode, GpuDevice, GpuInventory

MPS_CONTROL = "nvidia-cuda-mps-control"


def _text(value: Any) -> str:
    """NVML returns bytes in old bindings and str in new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _import_nvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _visible(devices: list[GpuDevice], spec: str | None) -> list[GpuDevice]:
    """Apply ``CUDA_VISIBLE_DEVICES`` the way CUDA does: indices or UUID prefixes,
    renumbered from 0, stopping at the first entry that matches nothing."""
    if spec is None:
        return devices
    chosen: list[GpuDevice] = []
    for token in (t.strip() for t in spec.split(",")):
        match = None
        if token.isdigit():
            index = int(token)
            match = devices[index] if index < len(devices) else None
        elif token:
            match = next((d for d in devices if d.uuid and d.uuid.startswith(token)), None)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return [
        GpuDevice(i, d.memory_bytes, d.uuid, d.name, d.free_bytes) for i, d in enumerate(chosen)
    ]


def detect_inventory(
    nvml: Any | None = None,
    *,
    which: Callable[[str], str | None] = shutil.which,
    env: Mapping[str, str] | None = None,
) -> GpuInventory:
    """Ask NVML for the GPUs of this machine; "unknown" when it cannot answer.

    ``nvml`` is a module with pynvml's functions (``nvmlInit``,
    ``nvmlDeviceGetCount``, ``nvmlDeviceGetHandleByIndex``,
    ``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetUUID``, ``nvmlDeviceGetName``,
    ``nvmlShutdown``); by default ``pynvml`` if installed. Any failure (no
    package, no driver, a broken call) yields an unknown inventory with a note
    saying why — detection never stops a plan.
    """
    env = os.environ if env is None else env
    module = nvml if nvml is not None else _import_nvml()
    # Without detected GPUs this machine is not the target, so whether it has
    # the MPS binary says nothing: mps_available stays unknown.
    if module is None:
        return GpuInventory.unknown("nvidia-ml-py is not installed: GPUs not detected")
    try:
        module.nvmlInit()
    except Exception as exc:
        return GpuInventory.unknown(f"NVML did not answer: {exc}")
    mps = which(MPS_CONTROL) is not None
    try:
        devices = []
        for index in range(int(module.nvmlDeviceGetCount())):
            handle = module.nvmlDeviceGetHandleByIndex(index)
            memory = module.nvmlDeviceGetMemoryInfo(handle)
            devices.append(
                GpuDevice(
                    index=index,
                    memory_bytes=int(memory.total),
                    free_bytes=int(memory.free),
                    uuid=_text(module.nvmlDeviceGetUUID(handle)),
                    name=_text(module.nvmlDeviceGetName(handle)),
                )
            )
    except Exception as exc:
        return GpuInventory.unknown(f"NVML failed while listing GPUs: {exc}")
    finally:
        with contextlib.suppress(Exception):  # a failed shutdown changes no fact read
            module.nvmlShutdown()
    visible = _visible(devices, env.get("CUDA_VISIBLE_DEVICES"))
    notes = ()
    if len(visible) != len(devices):
        notes = (f"CUDA_VISIBLE_DEVICES shows {len(visible)} of {len(devices)} GPUs",)
    return GpuInventory(tuple(visible), True, mps, "nvml", notes)


def apply_cluster(inventory: GpuInventory, cluster: ClusterConfig) -> GpuInventory:
    """Overlay the deploy file's ``[cluster]`` (and ``--gpus``/``--gpu-memory``).

    ``gpus`` sets the count (detected facts of the first GPUs are kept),
    ``gpu_memory`` sets every GPU's memory, ``mps_available`` whether the MPS
    control binary may be assumed. Declared values win over detected ones: that
    is how an H100 deployment is planned on a laptop.
    """
    if cluster.nodes:
        return declared_nodes(cluster, inventory)
    if cluster.gpus is None and cluster.gpu_memory is None and cluster.mps_available is None:
        return inventory
    devices = list(inventory.devices)
    count_known = inventory.count_known
    if cluster.gpus is not None:
        count_known = True
        devices = [devices[i] if i < len(devices) else GpuDevice(i) for i in range(cluster.gpus)]
    if cluster.gpu_memory is not None:
        devices = [GpuDevice(d.index, cluster.gpu_memory, d.uuid, d.name, None) for d in devices]
    mps = inventory.mps_available if cluster.mps_available is None else cluster.mps_available
    source = "config" if inventory.source == "unknown" else f"{inventory.source}+config"
    return GpuInventory(tuple(devices), count_known, mps, source, inventory.notes)


def declared_nodes(cluster: ClusterConfig, detected: GpuInventory) -> GpuInventory:
    """``[[cluster.nodes]]``: the machines of a cluster you plan for, in node order.

    Declared nodes replace what this machine detected (it is at most one of
    them); ``gpu_memory`` under ``[cluster]`` is the default for nodes that
    give none.
    """
    nodes, devices = [], []
    for node in cluster.nodes:
        memory = node.gpu_memory if node.gpu_memory is not None else cluster.gpu_memory
        first = len(devices)
        devices += [GpuDevice(first + i, memory) for i in range(node.gpus)]
        nodes.append(ClusterNode(node.name, node.gpus, first, node.cpus))
    mps = cluster.mps_available if cluster.mps_available is not None else None
    return GpuInventory(tuple(devices), True, mps, "config", detected.notes, tuple(nodes))


def inventory_from_cluster(cluster: ClusterConfig) -> GpuInventory:
    """The inventory a config declares, without detection (what pure planning uses)."""
    return apply_cluster(GpuInventory.unknown(), cluster)


def resolve_inventory(cluster: ClusterConfig, nvml: Any | None = None) -> GpuInventory:
    """Detect this machine's GPUs, then apply the declared overrides."""
    return apply_cluster(detect_inventory(nvml), cluster)


def inventory_for(config: Any, plugins: Any = None, *, detect: bool = True) -> GpuInventory:
    """The inventory ``omni plan`` and ``omni serve`` plan against.

    A launcher that sees a cluster (``ray`` with an address) answers with its
    nodes and GPUs; otherwise this machine is detected (unless ``detect`` is
    off) under the deploy file's ``[cluster]``, whose ``nodes`` plan for a
    cluster offline. ``cluster.gpu_memory`` (``--gpu-memory``) gives a live
    cluster's GPUs their memory, which Ray does not report.
    """
    if detect and config.runtime.launcher != "local":
        if plugins is None:
            from ..plugins import get_plugins

            plugins = get_plugins()
        seen = plugins.launcher(config.runtime.launcher).inventory(config)
        if seen is not None:
            memory = config.cluster.gpu_memory  # clusters report GPU counts, not memory
            if memory is not None:
                devices = tuple(GpuDevice(d.index, memory, d.uuid, d.name) for d in seen.devices)
                seen = GpuInventory(
                    devices,
                    True,
                    seen.mps_available,
                    f"{seen.source}+config",
                    seen.notes,
                    seen.nodes,
                )
            return seen
    cluster = config.cluster
    return resolve_inventory(cluster) if detect else inventory_from_cluster(cluster)
