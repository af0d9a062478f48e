"""Which node each process runs on, when the inventory has several.

The placement policy already chose GPUs by cluster id (the nodes' GPUs in
node order), so a GPU process goes where its GPU is. A process without a GPU
goes where ``[processes.NAME] node`` pins it, else by ``ray.strategy``:
``pack`` puts it beside the first process it exchanges payloads with (its
stage graph neighbours; the coordinator's node when it has none), so an edge
stays on one host where it can; ``spread`` puts it on the node with the
fewest processes. Ranks of one tensor-parallel group must share a node.
"""

from __future__ import annotations

from collections import Counter

from ..errors import suggestion
from ..schema import PipelineConfig
from .model import GpuInventory, NodesPlan, ProcessPlan, Refusal


def assign_nodes(
    config: PipelineConfig,
    processes: list[ProcessPlan],
    inventory: GpuInventory,
    problems: list[Refusal],
) -> NodesPlan | None:
    """Set ``node`` (and ``node_gpu``) on every process; None for a one-host inventory."""
    if not inventory.nodes:
        return None
    names = [node.name for node in inventory.nodes]
    strategy = config.ray.strategy
    waiting: list[ProcessPlan] = []
    for process in processes:
        pin = config.process_config(process.logical).node
        if pin is not None and pin not in names:
            problems.append(
                Refusal(
                    f"processes.{process.logical}.node names {pin!r}, which is not a node of "
                    "the cluster",
                    fix=suggestion(pin, names, kind="nodes"),
                )
            )
            pin = None
        if process.gpu is not None:
            found = inventory.node_of(process.gpu)
            if found is None:
                continue  # the GPU id itself is refused by the GPU checks
            node, local = found
            if pin is not None and pin != node.name:
                problems.append(
                    Refusal(
                        f"process {process.name!r} is pinned to node {pin!r} but its GPU "
                        f"{process.gpu} is on node {node.name!r} (GPU ids count the nodes' "
                        "GPUs in node order)",
                        fix=f"choose a GPU of node {pin!r} "
                        f"({_gpu_range(inventory, pin)}), or drop the pin",
                    )
                )
            process.node, process.node_gpu = node.name, local
        elif pin is not None:
            process.node = pin
        else:
            waiting.append(process)
    neighbours = _neighbours(config)
    for process in waiting:
        process.node = _choose(process, processes, neighbours, names, strategy)
    _check_tensor_parallel(processes, problems)
    _check_cpus(config, processes, inventory, problems)
    placed: dict[str, list[str]] = {}
    for process in processes:
        if process.node is not None:
            placed.setdefault(process.node, []).append(process.name)
    return NodesPlan(strategy, names[0], list(inventory.nodes), placed)


def _gpu_range(inventory: GpuInventory, name: str) -> str:
    node = next(n for n in inventory.nodes if n.name == name)
    if not node.gpus:
        return "it has none"
    last = node.first_gpu + node.gpus - 1
    return f"GPU {node.first_gpu}" if node.gpus == 1 else f"GPUs {node.first_gpu}-{last}"


def _neighbours(config: PipelineConfig) -> dict[str, list[str]]:
    """Logical processes that exchange payloads, in declaration order."""
    near: dict[str, list[str]] = {}
    for stage in config.stages:
        for target in stage.targets:
            a, b = config.process_of(stage), config.process_of(config.stage(target))
            if a != b:
                near.setdefault(a, []).append(b)
                near.setdefault(b, []).append(a)
    return near


def _choose(
    process: ProcessPlan,
    processes: list[ProcessPlan],
    neighbours: dict[str, list[str]],
    names: list[str],
    strategy: str,
) -> str:
    if strategy == "spread":
        load = Counter(p.node for p in processes if p.node is not None)
        return min(names, key=lambda name: (load[name], names.index(name)))
    for logical in neighbours.get(process.logical, []):
        for other in processes:
            if other.logical == logical and other.node is not None:
                return other.node
    return names[0]


def _check_tensor_parallel(processes: list[ProcessPlan], problems: list[Refusal]) -> None:
    groups: dict[tuple[str, int], set[str]] = {}
    for process in processes:
        if process.tp_size > 1 and process.node is not None:
            groups.setdefault((process.logical, process.replica), set()).add(process.node)
    for (logical, replica), nodes in groups.items():
        if len(nodes) > 1:
            problems.append(
                Refusal(
                    f"the tensor-parallel ranks of process {logical!r} (replica {replica}) "
                    f"would run on nodes {', '.join(sorted(nodes))}; ranks exchange "
                    "activations every layer and must share a node",
                    fix="give the stage GPUs of one node",
                )
            )


def _check_cpus(
    config: PipelineConfig,
    processes: list[ProcessPlan],
    inventory: GpuInventory,
    problems: list[Refusal],
) -> None:
    wanted = Counter(p.node for p in processes if p.node is not None)
    for node in inventory.nodes:
        need = wanted[node.name] * config.ray.cpus_per_process
        if node.cpus is not None and need > node.cpus:
            problems.append(
                Refusal(
                    f"node {node.name!r} has {node.cpus:g} CPUs but its {wanted[node.name]} "
                    f"processes reserve {need:g} (ray.cpus_per_process "
                    f"{config.ray.cpus_per_process:g} each)",
                    fix="lower ray.cpus_per_process, pin processes to other nodes, or use "
                    'ray.strategy = "spread"',
                )
            )
