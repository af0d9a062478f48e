"""The interface of a transport: how a payload crosses one edge of the stage graph.

Stages of one process hand each other Python objects directly (no
transport). An edge between processes uses ``runtime.transport`` (``auto``
means ``shm``) unless ``runtime.edge_transports`` names another for it; the
coordinator's links to the processes use ``runtime.transport`` too, and a
link between processes on different nodes uses ``runtime.cross_node_transport``
(see :mod:`omni_core.plan.transports`). A transport plugin registers instances of
:class:`Transport` through the ``omni_register_transports`` hook.

The contract, kept httpx-small:

* ``transport.listen(address, secret=...)`` returns the *receiving* end of an edge. It binds
  at once (so a bad or busy address fails where it is written, not at the first
  message) and owns what it bound: closing it removes the socket file.
  Any number of senders may connect to one receiver, and come and go (a
  restarted process reconnects); messages of one sender arrive in send order.
* ``transport.connect(address, secret=...)`` returns the *sending* end. It does no I/O:
  the connection is made by the first ``send``, which waits (bounded) for the
  receiver to appear, so processes may start in any order.
* ``transport.check_address(address)`` validates and normalises an address
  without binding anything: ``omni plan`` calls it for every address a
  process will listen at, so a bad one is refused before any child starts.
* ``scopes`` says where the transport can carry messages ("process", "host",
  "network"): ``omni plan`` refuses one without "host" or "network" for an
  edge between processes, and one without "network" for a link between nodes.
* ``secret`` is the deployment's random key (bytes). A transport that crosses a
  process boundary must make every connection prove it knows the secret
  before it decodes anything the peer sent, and must never decode a message
  in a way that can run code (the built-in ones use an HMAC
  handshake and :mod:`omni_core.wire`'s restricted decoding); one that stays in
  a process may ignore it.
* ``Channel.send`` / ``Channel.recv`` move one message; ``Channel.aclose``
  releases what the channel holds. A channel is an async context manager.

Errors: :class:`AddressError` for a malformed or unusable address;
:class:`ChannelClosed` when the channel itself was closed, or a send found no
live receiver (the message was not delivered).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any, Literal

from .errors import OmniError

Scope = Literal["process", "host", "network"]


class AddressError(OmniError, ValueError):
    """An address a transport cannot use: malformed, or already taken."""


class ChannelClosed(Exception):
    """The channel was closed, or its peer is gone; the message did not cross."""


class Channel(ABC):
    """One direction of one edge: ``send`` on one side, ``recv`` on the other.

    ``address`` is where the receiver listens, as bound (a TCP port of 0 is
    replaced by the port the system chose), so a receiver can tell its senders.
    """

    address: str = ""

    @abstractmethod
    async def send(self, message: Any) -> None:
        """Deliver ``message``; tensors, arrays and bytes should not be pickled."""

    @abstractmethod
    async def recv(self) -> Any:
        """The next message, in send order (per sender); waits without polling."""

    async def aclose(self) -> None:  # noqa: B027 - optional for in-memory channels
        """Release what the channel holds (sockets, shared memory)."""

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Transport(ABC):
    """A named way to move messages between stages.

    ``scopes`` says which edges it can serve: within one process, between
    processes of one host, or across the network.
    """

    name: str = ""
    scopes: frozenset[Scope] = frozenset()

    @abstractmethod
    def listen(self, address: str, *, secret: bytes) -> Channel:
        """The receiving end of an edge, bound at ``address`` (owned by the receiver)."""

    @abstractmethod
    def connect(self, address: str, *, secret: bytes) -> Channel:
        """The sending end of an edge whose receiver listens at ``address``."""

    def check_address(self, address: str) -> str:
        """``address`` normalised, or :class:`AddressError` saying what is wrong."""
        return address


class LazyTransport(Transport):
    """A transport whose implementation is imported on first use.

    Registering through this keeps ``omni plugins list`` and planning from
    importing socket and shared-memory machinery they never use.
    ``target`` is ``"package.module:Class"``; the class is instantiated
    without arguments.
    """

    def __init__(self, name: str, target: str):
        self.name = name
        self.target = target
        self._impl: Transport | None = None

    def load(self) -> Transport:
        if self._impl is None:
            from .factory import import_object

            self._impl = import_object(self.target, what=f"transport {self.name!r}")()
        return self._impl

    @property  # type: ignore[override]
    def scopes(self) -> frozenset[Scope]:
        return self.load().scopes

    def listen(self, address: str, *, secret: bytes) -> Channel:
        return self.load().listen(address, secret=secret)

    def connect(self, address: str, *, secret: bytes) -> Channel:
        return self.load().connect(address, secret=secret)

    def check_address(self, address: str) -> str:
        return self.load().check_address(address)
