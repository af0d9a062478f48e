"""Which transport carries each edge between processes.

Inside one process payloads are passed as Python objects (no transport).
Between processes the deployment's ``runtime.transport`` is used (``auto``
means ``shm``: one host, tensors through shared memory); an edge listed in
``runtime.edge_transports`` (``"tts_engine->vocoder" = "socket"``) uses its own.
A receiving process listens once per transport its incoming edges use.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..schema import PipelineConfig

AUTO_BETWEEN_PROCESSES = "shm"
COORDINATOR = "coordinator"


def default_transport(config: PipelineConfig) -> str:
    name = config.runtime.transport
    return AUTO_BETWEEN_PROCESSES if name == "auto" else name


def edge_transport(config: PipelineConfig, source: str, target: str) -> str:
    return config.runtime.edge_transports.get(f"{source}->{target}", default_transport(config))


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
