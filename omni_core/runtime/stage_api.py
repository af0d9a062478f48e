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
    _skip: Callable[[tuple[str, ...]], Awaitable[None]] | None = field(default=None, repr=False)

    async def emit(self, chunk: Any) -> None:
        """Send ``chunk`` downstream now (to streaming targets, or the client)."""
        if self._emit is None:
            raise RuntimeError("this stage has no streaming target and is not terminal")
        await self._emit(chunk)

    async def skip(self, *targets: str) -> None:
        """Send this request nothing more to ``targets`` (some of this stage's ``next``).

        They, and every stage that would only hear from them, are skipped for
        this request: no chunks and no output reach them, fan-ins stop
        waiting for them, and the request no longer waits for their
        terminals. A streaming stage says so before its first chunk (a route
        function decides only after ``run`` returns, too late for a stream):
        a chat request that asked for text only skips the speech stages.
        """
        if self._skip is None:
            raise RuntimeError("skip() is only available to stages run by the runtime")
        await self._skip(targets)


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
