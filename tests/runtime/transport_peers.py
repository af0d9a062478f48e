"""Child-process ends for the transport tests (imported by module name under spawn).

Kept apart from the test module so that ``multiprocessing`` (spawn) can import
these functions in a fresh interpreter by a plain module name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import anyio

from omni_core.wire import allow_wire_types

SECRET = b"test-deployment-secret-32-bytes!"  # what the runtime would hand both sides


@dataclass
class Point:
    """A plain object inside a message (pickled as part of the skeleton)."""

    x: int
    label: str


# Registered at import, so that the test process and the spawned peers both accept it.
allow_wire_types([Point])


def _transport(name: str) -> Any:
    from omni_core.runtime.transports import ShmTransport, SocketTransport

    return {"shm": ShmTransport, "socket": SocketTransport}[name]()


def echo(name: str, inbox: str, outbox: str, count: int) -> None:
    """Receive ``count`` messages at ``inbox`` and send each back to ``outbox``."""
    import torch  # noqa: F401 - the child rebuilds tensors

    transport = _transport(name)

    async def main() -> None:
        async with (
            transport.listen(inbox, secret=SECRET) as rx,
            transport.connect(outbox, secret=SECRET) as tx,
        ):
            for _ in range(count):
                await tx.send(await rx.recv())

    anyio.run(main)


def flood(name: str, address: str, nbytes: int, count: int, sent: Any, go_on: Any) -> None:
    """Send ``count`` tensors of ``nbytes`` (forever if ``count`` < 0), tell the
    parent through ``sent`` after each, then, if ``go_on`` is given, wait for it
    and try one more send (which finds the receiver gone), then report the
    memfds this process still holds."""
    import torch

    transport = _transport(name)

    async def main() -> None:
        tensor = torch.full((nbytes // 4,), 7.0)
        tx = transport.connect(address, secret=SECRET)
        done = 0
        while count < 0 or done < count:
            await tx.send({"seq": done, "data": tensor})
            done += 1
            sent.put(done)
        if go_on is not None:
            await anyio.to_thread.run_sync(go_on.wait)
            try:
                await tx.send({"seq": -1, "data": tensor})
                sent.put("delivered")
            except Exception as exc:  # ChannelClosed: the receiver is gone
                sent.put(type(exc).__name__)
            sent.put(memfds(os.getpid()))
        await tx.aclose()

    anyio.run(main)


def memfds(pid: int) -> int:
    """How many descriptors and mappings of omni segments process ``pid`` holds."""
    found = 0
    fd_dir = f"/proc/{pid}/fd"
    for entry in os.listdir(fd_dir):
        try:
            if "memfd:omni-shm" in os.readlink(f"{fd_dir}/{entry}"):
                found += 1
        except OSError:
            continue
    with open(f"/proc/{pid}/maps") as maps:
        found += sum("memfd:omni-shm" in line for line in maps)
    return found
