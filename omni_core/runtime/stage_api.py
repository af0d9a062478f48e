"""What a stage factory returns, and what a stage sees of one request.

A stage is an object with ``async def run(self, request) -> output`` (a plain
async function is accepted too). The runtime calls ``run`` once per request,
concurrently for concurrent requests: a batching stage collects the calls it
has in flight and serves them together. ``request.emit(chunk)`` sends an
incremental chunk downstream before ``run`` returns (``stream_to`` edges, or
the client when the stage is terminal); ``request.stream`` iterates the chunks
of a streaming upstream. Optional ``async def start()`` and ``async def
aclose()`` run once when the process starts and stops.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class StageRequest:
    """One request as one stage sees it."""

    request_id: str
    data: Any = None
    params: Mapping[str, Any] = field(default_factory=dict)
    stream: AsyncIterator[Any] | None = None
    _emit: Callable[[Any], Awaitable[None]] | None = field(default=None, repr=False)

    async def emit(self, chunk: Any) -> None:
        """Send ``chunk`` downstream now (to streaming targets, or the client)."""
        if self._emit is None:
            raise RuntimeError("this stage has no streaming target and is not terminal")
        await self._emit(chunk)


@runtime_checkable
class Stage(Protocol):
    async def run(self, request: StageRequest) -> Any: ...


class FunctionStage:
    """Adapts ``async def fn(request)`` to the stage interface."""

    def __init__(self, fn: Callable[[StageRequest], Awaitable[Any]]):
        self.fn = fn

    async def run(self, request: StageRequest) -> Any:
        return await self.fn(request)


def as_stage(obj: Any, *, name: str) -> Any:
    """The stage object a factory returned, checked; a coroutine function is wrapped."""
    if inspect.iscoroutinefunction(obj):
        return FunctionStage(obj)
    run = getattr(obj, "run", None)
    if run is None or not inspect.iscoroutinefunction(run):
        raise TypeError(
            f"the factory of stage {name!r} returned {type(obj).__name__}, which has no "
            "'async def run(self, request)'"
        )
    return obj
