"""The interface of a transport: how a payload crosses one edge of the stage graph.

The runtime picks one transport per edge from the plan: ``inproc`` when both
stages share a process, ``shm`` between processes of one host, ``socket``
across hosts; a deploy file may override the choice. A transport plugin
registers instances of :class:`Transport` through the
``omni_register_transports`` hook.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

Scope = Literal["process", "host", "network"]


class Channel(ABC):
    """One direction of one edge: ``send`` on one side, ``recv`` on the other."""

    @abstractmethod
    async def send(self, message: Any) -> None:
        """Deliver ``message``; tensors, arrays and bytes should not be pickled."""

    @abstractmethod
    async def recv(self) -> Any:
        """The next message, in send order."""

    async def aclose(self) -> None:  # noqa: B027 - optional for in-memory channels
        """Release what the channel holds (sockets, shared memory)."""


class Transport(ABC):
    """A named way to move messages between stages.

    ``scopes`` says which edges it can serve: within one process, between
    processes of one host, or across the network.
    """

    name: str = ""
    description: str = ""
    scopes: frozenset[Scope] = frozenset()

    @abstractmethod
    def listen(self, address: str) -> Channel:
        """The receiving end of an edge, bound at ``address`` (owned by the receiver)."""

    @abstractmethod
    def connect(self, address: str) -> Channel:
        """The sending end of an edge whose receiver listens at ``address``."""
