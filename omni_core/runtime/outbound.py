"""The sending channels a process keeps open, one per destination.

Why one place: the coordinator and every child send the same way — reuse the
channel to a destination, and when a send finds it closed (the receiving
process restarted since), reconnect once and send again; a second failure is
the caller's to handle.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from ..transport import Channel, ChannelClosed


class Outbound:
    """Open sending channels keyed by destination (an address, or transport and address)."""

    def __init__(self) -> None:
        self._channels: dict[Hashable, Channel] = {}

    async def send(self, key: Hashable, connect: Callable[[], Channel], message: Any) -> None:
        """Send ``message`` on the channel for ``key``, connecting (``connect()``) when needed."""
        for attempt in (1, 2):
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = connect()
            try:
                await channel.send(message)
                return
            except ChannelClosed:
                del self._channels[key]
                await channel.aclose()
                if attempt == 2:
                    raise

    async def aclose(self) -> None:
        """Close every channel; the cache can be used again afterwards."""
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.aclose()
