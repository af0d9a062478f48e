"""Which transport carries each edge between processes.

Inside one process payloads are passed as Python objects (no transport).
Between processes the deployment's ``runtime.transport`` is used (``auto``
means ``shm``: one host, tensors through shared memory); an edge listed in
``runtime.edge_transports`` (``"tts_engine->vocoder" = "socket"``) uses its own.
A receiving process listens once per transport its incoming edges use.

Planning checks the choice against what each transport declares: an edge (or
the coordinator's link to a process) crossing processes needs a transport
whose ``scopes`` include "host" or "network", and every address a process
will listen at must pass the transport's ``check_address`` - so a transport
that cannot serve an edge is refused by ``omni plan``, naming both.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, OmniError
from ..schema import PipelineConfig
from .model import EdgePlan, LinkPlan, ProcessPlan, Refusal, StagePlacement

AUTO_BETWEEN_PROCESSES = "shm"
COORDINATOR = "coordinator"


def default_transport(config: PipelineConfig) -> str:
    name = config.runtime.transport
    return AUTO_BETWEEN_PROCESSES if name == "auto" else name


def edge_transport(config: PipelineConfig, source: str, target: str) -> str:
    return config.runtime.edge_transports.get(f"{source}->{target}", default_transport(config))


def plan_edges(
    config: PipelineConfig,
    processes: list[ProcessPlan] = (),  # type: ignore[assignment]
    stages: list[StagePlacement] = (),  # type: ignore[assignment]
) -> list[EdgePlan]:
    """Every edge of the stage graph, its process-to-process links and their transports.

    A request is bound to one replica of each logical process, so every
    replica of a source may send to every replica of a target: each such pair
    of processes (leaders: other tensor-parallel ranks receive nothing) is a
    link. A link between nodes uses ``runtime.cross_node_transport``.
    """
    logical = {s.name: config.process_of(s) for s in config.stages}
    leaders = {p.name: p for p in processes if p.leader}
    holders: dict[str, list[ProcessPlan]] = {}
    for placement in stages:
        if placement.process in leaders:
            holders.setdefault(placement.stage, []).append(leaders[placement.process])
    cross = config.runtime.cross_node_transport
    edges = []
    for stage in config.stages:
        for target in stage.targets:
            crosses = logical[stage.name] != logical.get(target) or stage.tp_size > 1
            same_host = edge_transport(config, stage.name, target) if crosses else None
            links = [
                LinkPlan(
                    a.name, b.name, cross if a.node != b.node else same_host or "", a.node != b.node
                )
                for a in holders.get(stage.name, [])
                for b in holders.get(target, [])
                if a.name != b.name and crosses
            ]
            used = sorted({link.transport for link in links}) or ([same_host] if same_host else [])
            edges.append(
                EdgePlan(
                    source=stage.name,
                    target=target,
                    stream=target in stage.stream_to,
                    transport="/".join(used) if used else None,
                    links=links,
                )
            )
    return edges


def check_cross_node(config: PipelineConfig, edges: list[EdgePlan], plugins: Any) -> list[Refusal]:
    """Links between nodes need a transport that reaches the network."""
    crossing = [f"{k.source}->{k.target}" for e in edges for k in e.links if k.cross_node]
    if not crossing:
        return []
    name = config.runtime.cross_node_transport
    try:
        transport = plugins.transport(name)
    except OmniError:
        return []  # an unknown name is refused, with its origin, when the config resolves
    if "network" in set(transport.scopes):
        return []
    return [
        Refusal(
            f"runtime.cross_node_transport {name!r} cannot leave its host (scopes: "
            f"{', '.join(sorted(transport.scopes)) or 'none'}), but processes on different "
            f"nodes exchange payloads: {', '.join(crossing[:4])}"
            + (f" and {len(crossing) - 4} more" if len(crossing) > 4 else ""),
            fix='set runtime.cross_node_transport = "tcp"',
        )
    ]


def check_edges(config: PipelineConfig) -> None:
    """Every override names a real edge."""
    edges = {f"{s.name}->{t}" for s in config.stages for t in s.targets}
    for edge in config.runtime.edge_transports:
        if edge not in edges:
            raise ConfigError(
                f"runtime.edge_transports names {edge!r}, which is not an edge of the pipeline",
                hint="edges: " + ", ".join(sorted(edges)),
            )


def incoming_transports(config: PipelineConfig, stages: list[str]) -> set[str]:
    """The transports a process holding ``stages`` must listen on."""
    names = {default_transport(config)}
    for stage in config.stages:
        for target in stage.targets:
            if target in stages:
                names.add(edge_transport(config, stage.name, target))
    return names


def address_for(base: str, transport: str, default: str) -> str:
    """One listening address per transport: the plan's endpoint for the default."""
    return base if transport == default else f"{base}.{transport}"


def check_transports(
    config: PipelineConfig, processes: list[ProcessPlan], plugins: Any
) -> list[Refusal]:
    """Each transport can serve the edges it is chosen for, at the addresses planned."""
    problems: list[Refusal] = []
    logical = {s.name: config.process_of(s) for s in config.stages}
    crossing: dict[str, list[str]] = {default_transport(config): ["the coordinator's links"]}
    for stage in config.stages:
        for target in stage.targets:
            if logical[stage.name] != logical.get(target) or stage.tp_size > 1:
                edge = f"{stage.name}->{target}"
                crossing.setdefault(edge_transport(config, stage.name, target), []).append(edge)
    for name, edges in crossing.items():
        try:
            transport = plugins.transport(name)
        except OmniError:
            continue  # an unknown name is refused, with its origin, when the config resolves
        if not {"host", "network"} & set(transport.scopes):
            problems.append(
                Refusal(
                    f"transport {name!r} carries messages within one process only "
                    f"(scopes: {', '.join(sorted(transport.scopes)) or 'none'}), but it is "
                    f"chosen for {', '.join(edges)}, between processes",
                    fix="choose a transport between processes (shm or socket) with "
                    "runtime.transport / runtime.edge_transports",
                )
            )
            continue
        for process in processes:
            if process.endpoint is None:
                continue
            address = address_for(unix_address(process.endpoint), name, default_transport(config))
            try:
                transport.check_address(address)
            except OmniError as exc:
                problems.append(
                    Refusal(
                        f"transport {name!r} cannot listen at {address} for process "
                        f"{process.name!r}: {exc.message}",
                        fix=exc.hint or "choose another transport, or endpoints.base_path",
                    )
                )
    return problems


def unix_address(endpoint: str) -> str:
    """Plans hold socket paths; transports take ``unix:`` addresses."""
    return endpoint if ":" in endpoint.split("/", 1)[0] else f"unix:{endpoint}"
