"""Which transport and address a message takes from one process to another.

On one host every process listens at its Unix endpoint, once per transport
its incoming edges use (:func:`~omni_core.plan.transports.incoming_transports`).
Across nodes a Unix socket cannot be reached, so a message between processes
on different nodes (the coordinator counts as a process on the first node)
takes ``runtime.cross_node_transport`` to the receiver's TCP address, which
the launcher reserved on that node before any process started
(``addresses``). The runtime and every worker route through this one table,
so a sender and its receiver can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..plan.model import DeploymentPlan
from ..plan.transports import (
    address_for,
    default_transport,
    edge_transport,
    incoming_transports,
    unix_address,
)
from ..schema import PipelineConfig

COORDINATOR = "coordinator"
"""The parent's name in ``addresses``; ``None`` stands for it in the methods below."""


@dataclass
class Links:
    plan: DeploymentPlan
    config: PipelineConfig
    addresses: dict[str, str] = field(default_factory=dict)  # process -> tcp://, on many nodes

    def node(self, process: str | None) -> str | None:
        if process is None:
            return self.plan.nodes.coordinator if self.plan.nodes else None
        return self.plan.process(process).node

    def crosses(self, source: str | None, target: str | None) -> bool:
        return self.node(source) != self.node(target)

    def route(
        self, source: str | None, target: str | None, edge: tuple[str, str] | None = None
    ) -> tuple[str, str]:
        """(transport name, address) for a message from ``source`` to ``target``.

        ``edge`` is the (source stage, target stage) of a payload; messages
        without one (requests, results, heartbeats, aborts) use the default
        transport on one host.
        """
        default = default_transport(self.config)
        if self.crosses(source, target):
            return self.config.runtime.cross_node_transport, self.tcp_address(target)
        name = edge_transport(self.config, *edge) if edge else default
        base = (
            unix_address(self.plan.endpoints.coordinator)
            if target is None
            else unix_address(self.plan.process(target).endpoint)
        )
        return name, address_for(base, name, default)

    def tcp_address(self, process: str | None) -> str:
        key = COORDINATOR if process is None else process
        try:
            return self.addresses[key]
        except KeyError:
            raise RuntimeError(
                f"no TCP address was reserved for {key} on node {self.node(process)}; "
                'only a multi-node launcher (runtime.launcher = "ray") can run this plan'
            ) from None

    def listens(self, process: str | None, stages: list[str] = ()) -> list[tuple[str, str]]:
        """Every (transport, address) some sender will use to reach ``process``.

        On its own host a process listens as it always has: once per transport
        of its incoming edges (``stages`` are its stage names). A sender on
        another node adds the cross-node transport at its TCP address.
        """
        default = default_transport(self.config)
        if process is None:
            routes = {(default, unix_address(self.plan.endpoints.coordinator))}
            senders: set[str | None] = {p.name for p in self.plan.processes}
        else:
            base = unix_address(self.plan.process(process).endpoint)
            routes = {
                (name, address_for(base, name, default))
                for name in incoming_transports(self.config, list(stages))
            }
            senders = {None}
            senders.update(
                link.source
                for edge in self.plan.edges
                for link in edge.links
                if link.target == process
            )
        if any(self.crosses(source, process) for source in senders):
            routes.add((self.config.runtime.cross_node_transport, self.tcp_address(process)))
        return sorted(routes)
