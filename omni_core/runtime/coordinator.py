"""The coordinator: admits requests, binds them to replicas, collects their outputs.

It lives in the parent process. A request is bound once to one replica of
every logical process (least-loaded or round-robin) and stays there across
its stages; it completes when every terminal stage it did not skip has
answered, and fails at once when a stage fails or a process it is bound to
dies.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..errors import OmniError
from . import messages as m
from .graph import StageGraph


class Overloaded(OmniError):
    """Admission is full: the API answers 429 at once instead of queueing."""


class Unavailable(OmniError):
    """The deployment cannot take requests now (stopping, or a process group failed): 503."""


class RequestFailed(OmniError):
    """A request failed in a stage or lost a process; the message says which.

    ``client_error`` is true when a stage refused the request as invalid
    (:class:`~omni_core.errors.RequestError`): the API answers 400, not 500.
    ``process_lost`` is true when a process the request was bound to died or
    hung: nothing was wrong with the request, and a retry can succeed once the
    process is restarted (the API answers 503).
    """

    def __init__(
        self,
        message: str,
        *,
        client_error: bool = False,
        process_lost: bool = False,
        stage: str = "",
        process: str = "",
        detail: str = "",
        **kw: object,
    ):
        super().__init__(message, **kw)
        self.client_error = client_error
        self.process_lost = process_lost
        # Where it failed (the stage, the process that ran it) and the stage's
        # traceback: for the server's log, never for the client.
        self.stage, self.process, self.detail = stage, process, detail


SUBMIT_SEND_TIMEOUT = 10.0  # seconds to hand a new request to the entry stage


@dataclass
class Event:
    """One thing a request produced: a chunk or a final output of a terminal stage."""

    stage: str
    data: Any
    final: bool


@dataclass
class RequestHandle:
    """The caller's view of one request."""

    request_id: str
    binding: dict[str, int]
    pending: set[str]
    events: Any  # receive side of a memory stream of Event
    _send: Any = field(repr=False, default=None)
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    client_error: bool = False
    process_lost: bool = False
    failed_stage: str = ""  # a stage's failure: the stage, its process, its traceback
    failed_process: str = ""
    detail: str = ""
    done: anyio.Event = field(default_factory=anyio.Event)
    skipped: set[str] = field(default_factory=set)  # stages this request will not run

    async def stream(self) -> AsyncIterator[Event]:
        """Chunks and final outputs as they arrive; raises RequestFailed on failure."""
        async for event in self.events:
            yield event
        if self.error:
            raise self.failure()

    def failure(self) -> RequestFailed:
        return RequestFailed(
            self.error or "",
            client_error=self.client_error,
            process_lost=self.process_lost,
            stage=self.failed_stage,
            process=self.failed_process,
            detail=self.detail,
        )

    async def result(self) -> dict[str, Any]:
        """Wait for completion: the final output of every terminal stage."""
        await self.done.wait()
        if self.error:
            raise self.failure()
        return dict(self.outputs)


class Coordinator:
    """Request bookkeeping; the Runtime gives it a way to send envelopes."""

    def __init__(
        self,
        graph: StageGraph,
        replicas: dict[str, int],
        *,
        max_inflight: int,
        binding: str = "least-loaded",
        stage_process: dict[str, str] | None = None,
    ):
        self.graph = graph
        # Which logical process runs each stage: a request that skips every stage of
        # a process does not need it, so losing that process does not fail it.
        self.stage_process = dict(stage_process or {})
        # Stages some request may skip (a route function's or a stream's targets, and
        # what only they feed); a process running only such stages is optional.
        routed = {
            target
            for stage in graph.stages.values()
            if stage.route_fn or stage.stream_to
            for target in stage.targets
        }
        skippable = graph.skip_closure(routed)
        self.optional = {
            process
            for process in set(self.stage_process.values())
            if all(s in skippable for s, p in self.stage_process.items() if p == process)
        }
        self.replicas = replicas
        self.max_inflight = max_inflight
        self.binding_mode = binding
        self.requests: dict[str, RequestHandle] = {}
        self.load: dict[tuple[str, int], int] = {}
        self.unavailable: dict[tuple[str, int], str] = {}
        self.accepting = True
        self._round_robin = {p: itertools.count() for p in replicas}
        self.send: Any = None  # async (envelope) -> None, set by the runtime
        self.completed = 0
        self.failed = 0
        self.stage_stats: dict[str, dict[str, dict[str, int]]] = {}  # process -> stage -> depth
        # process -> stage -> {"count": runs ended, "seconds": their total}, since it started
        self.stage_runs: dict[str, dict[str, dict[str, float]]] = {}
        self.received: dict[str, dict[str, int]] = {}  # process -> transport -> messages
        self.heartbeats: dict[str, float] = {}  # process -> monotonic time of its last heartbeat

    # -- admission and binding ---------------------------------------------
    def _bind(self) -> dict[str, int]:
        binding = {}
        for process, count in self.replicas.items():
            healthy = [r for r in range(count) if (process, r) not in self.unavailable]
            if not healthy:
                reason = self.unavailable[(process, 0)]
                if process not in self.optional:
                    raise Unavailable(f"process {process!r} is not serving: {reason}")
                # Bound anyway: a request may never need it (a text-only chat skips the
                # talker); one that does fails when its stage cannot reach it (503).
                binding[process] = 0
                continue
            start = next(self._round_robin[process])
            order = [healthy[(start + i) % len(healthy)] for i in range(len(healthy))]
            if self.binding_mode == "round-robin":
                binding[process] = order[0]
            else:  # least-loaded; ties go round-robin so idle replicas share the work
                binding[process] = min(order, key=lambda r: self.load.get((process, r), 0))
        return binding

    async def track(
        self, data: Any, params: dict[str, Any] | None = None, request_id: str | None = None
    ) -> RequestHandle:
        """Register a request (admission limit, binding to replicas), send it to the entry
        stage, and track it until its terminal outputs arrive or it fails."""
        if not self.accepting:
            raise Unavailable("the server is shutting down")
        if len(self.requests) >= self.max_inflight:
            raise Overloaded(
                f"{len(self.requests)} requests in flight, the limit is {self.max_inflight}",
                hint="retry later, add replicas, or raise runtime.max_inflight",
            )
        request_id = request_id or uuid.uuid4().hex
        binding = self._bind()
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        handle = RequestHandle(request_id, binding, set(self.graph.terminals), receive, send)
        self.requests[request_id] = handle
        for key in binding.items():
            self.load[key] = self.load.get(key, 0) + 1
        envelope = m.Envelope(
            m.DELIVER, request_id, self.graph.entry, "client", data, dict(params or {}), binding
        )
        try:
            # Shielded: a caller cancelled here (a client gone mid-submit) must still get
            # the handle back to abort it, or the request would stay registered and hold
            # its admission slot forever. Bounded, so a stuck socket cannot hold it.
            with anyio.CancelScope(shield=True), anyio.fail_after(SUBMIT_SEND_TIMEOUT):
                await self.send(envelope)
        except Exception as exc:
            self._finish(handle, f"could not reach stage {self.graph.entry!r}: {exc!r}")
            raise RequestFailed(handle.error or "") from None
        return handle

    # -- what the stages report ---------------------------------------------
    def on_envelope(self, env: m.Envelope) -> None:
        if env.kind == m.HEARTBEAT:
            self.stage_stats[env.source] = env.data["queue"]
            self.stage_runs[env.source] = env.data["runs"]
            self.received[env.source] = env.data.get("received", {})
            self.heartbeats[env.source] = time.monotonic()
            return
        handle = self.requests.get(env.request_id)
        if handle is None:
            return  # a late message of a request that already ended
        if env.kind == m.OUTPUT_CHUNK:
            _offer(handle, Event(env.source, env.data, final=False))
        elif env.kind == m.OUTPUT:
            handle.outputs[env.source] = env.data
            _offer(handle, Event(env.source, env.data, final=True))
            handle.pending.discard(env.source)
            if not handle.pending:
                self._finish(handle, None)
        elif env.kind == m.SKIPPED:
            handle.skipped |= set(env.skipped)
            handle.pending -= set(env.skipped)
            if not handle.pending:
                self._finish(handle, None)
        elif env.kind == m.FAILED:
            handle.client_error = env.client_error
            handle.process_lost = env.process_lost
            handle.failed_stage, handle.failed_process = env.source, env.process
            handle.detail = env.detail
            message = env.error if env.client_error else f"stage {env.source!r} failed: {env.error}"
            self._finish(handle, message)

    def fail_process(self, logical: str, replica: int, reason: str) -> list[RequestHandle]:
        """A process died: fail every request bound to it, at once."""
        failed = [
            h
            for h in self.requests.values()
            if h.binding.get(logical) == replica and logical in self.needed(h)
        ]
        for handle in failed:
            handle.process_lost = True
            self._finish(handle, reason)
        return failed

    def needed(self, handle: RequestHandle) -> set[str]:
        """The logical processes that run a stage ``handle`` has not skipped."""
        if not self.stage_process:
            return set(handle.binding)
        return {p for s, p in self.stage_process.items() if s not in handle.skipped}

    def abort(self, handle: RequestHandle, reason: str) -> None:
        if handle.request_id in self.requests:
            self._finish(handle, reason)

    def _finish(self, handle: RequestHandle, error: str | None) -> None:
        if self.requests.pop(handle.request_id, None) is None:
            return
        for key in handle.binding.items():
            self.load[key] -= 1
        handle.error = error
        if error:
            self.failed += 1
        else:
            self.completed += 1
        handle._send.close()
        handle.done.set()

    @property
    def inflight(self) -> int:
        return len(self.requests)


def _offer(handle: RequestHandle, event: Event) -> None:
    # The buffer is unbounded (a request's output is finite), so a slow reader
    # never stalls the coordinator and never loses a chunk.
    # A closed stream means the caller stopped listening; the request is being aborted.
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        handle._send.send_nowait(event)
