"""The runtime facade: launch a plan, supervise it, route requests through it.

``async with Runtime(plan, config) as runtime: handle = await runtime.dispatch(data)``
is all a caller needs (``omni serve``, ``omni run``, tests). Start-up goes
wave by wave (weight-sharing leaders before followers); a failed start tears
everything down. While serving, a process that dies fails the requests bound
to it at once, and its group is restarted with back-off while the others keep
serving. Closing stops admission, gives in-flight requests a grace period,
stops the children (TERM, then KILL) and removes the runtime directory; the
processes' logs stay in their own directory (see :mod:`.logdir`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio

from ..errors import NotImplementedYet
from ..plan.admission import admission_limit
from ..plan.model import DeploymentPlan
from ..plan.transports import check_edges
from ..plugins import OmniPlugins, get_plugins
from ..schema import PipelineConfig
from ..wire import allow_wire_types
from . import logdir, rundir
from . import messages as m
from .coordinator import Coordinator, RequestHandle
from .graph import StageGraph
from .links import Links
from .mps import MpsDaemon, daemons_for
from .outbound import Outbound
from .processes import Child, StartupError, describe_exit
from .routing_table import RoutingTable
from .transports._auth import new_secret
from .weight_share.leftovers import remove_leftovers
from .worker import ChildSpec

Progress = Callable[[str, str, dict[str, Any]], None]


class Runtime:
    def __init__(
        self,
        plan: DeploymentPlan,
        config: PipelineConfig,
        *,
        plugins: OmniPlugins | None = None,
        plugin_modules: Iterable[str] = (),
        on_progress: Progress | None = None,
    ):
        check_edges(config)
        if plan.weight_share.groups and config.runtime.launcher != "local":
            leaders = ", ".join(g.leader for g in plan.weight_share.groups)
            raise NotImplementedYet(
                f"the plan shares weights between replicas (leaders: {leaders}), but weight "
                f"sharing is not implemented yet for launcher {config.runtime.launcher!r}: a "
                "follower maps its leader's memory, so both must run on this host",
                hint='set weight_share = "off", or runtime.launcher = "local"',
            )
        ranks = [p.name for p in plan.processes if p.tp_rank is not None]
        if ranks and config.runtime.launcher != "local":
            raise NotImplementedYet(
                f"the plan runs tensor-parallel rank processes ({', '.join(ranks)}), but they "
                f"are not implemented yet for launcher {config.runtime.launcher!r}: the ranks "
                "meet at a file in this host's runtime directory",
                hint='set tp_size = 1, or runtime.launcher = "local"',
            )
        self.plan, self.config = plan, config
        self.plugins = plugins or get_plugins()
        self.plugin_modules = list(plugin_modules)
        self.graph = StageGraph.of(config)
        self.table = RoutingTable.of(plan, config)
        self.coordinator = Coordinator(
            self.graph,
            self.table.replicas,
            max_inflight=admission_limit(config, self.table.replicas, plan.running_requests),
            binding=config.runtime.binding,
            stage_process=self.table.stage_process,
        )
        self.coordinator.send = self._send_from_coordinator
        # This run's process logs: named now, created at start, kept after stop.
        self.log_dir = logdir.new_run_dir(
            logdir.log_base(config.runtime.log_dir), plan.endpoints.deployment_id
        )
        self.children = {
            p.name: Child(p, os.path.join(self.log_dir, f"{p.name}.log")) for p in plan.processes
        }
        self.on_progress = on_progress or (lambda *_: None)
        self.launcher = self.plugins.launcher(config.runtime.launcher)
        self.session = self.launcher.session(plan, config)
        self.links = Links(plan, config)
        self.inboxes: list[Any] = []
        self.outbound = Outbound()
        self._tg: Any = None
        self._stack: Any = None
        self.started_at = 0.0
        # Every process started and ready: until then /health says "starting" and requests
        # are refused with a 503 that says so (the HTTP server listens during start-up).
        self.ready = False
        self.mps: dict[int, MpsDaemon] = {}
        self._owns_dir = False
        self._heard_floor = 0.0  # see _monitor: no child is blamed for the parent's stall
        self._tp_generations: dict[tuple[str, int], int] = {}  # see _tp_store
        # Every connection between this deployment's processes proves it knows this.
        self.secret = new_secret()
        self._share_locks = {g.leader: anyio.Lock() for g in plan.weight_share.groups}
        allow_wire_types(self.plugins.wire_types())

    # -- lifecycle ----------------------------------------------------------
    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        self.started_at = time.monotonic()
        rundir.prepare(self.plan.endpoints.base_path, self.plan.endpoints.runtime_dir)
        self._owns_dir = True
        try:
            logdir.prepare(self.log_dir, self.plan.endpoints.deployment_id)
        except BaseException:
            await self.aclose(grace=0)
            raise
        try:
            enabled = [gpu for gpu, d in self.plan.mps.gpus.items() if d.enabled]
            self.mps = daemons_for(enabled, self.plan.endpoints.runtime_dir)
            for daemon in self.mps.values():
                await anyio.to_thread.run_sync(daemon.start)
                self.on_progress("mps", f"gpu{daemon.gpu}", {"pipe": daemon.pipe_dir})
            with anyio.fail_after(self.config.ray.connect_timeout + 30):
                await self.session.open()
            self.links = Links(self.plan, self.config, dict(self.session.addresses))
            for name, address in self.links.listens(None):
                transport = self.plugins.transport(name)
                self.inboxes.append(transport.listen(address, secret=self.secret))
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            for inbox in self.inboxes:
                self._tg.start_soon(self._receive, inbox)
            for wave in self.plan.start_waves:
                await self._start_wave([self.children[name] for name in wave])
            self._tg.start_soon(self._monitor)
            self.ready = True
        except BaseException:
            await self.aclose(grace=0)
            raise

    async def _start_wave(self, children: list[Child]) -> None:
        for child in children:
            self.on_progress("loading", child.name, {"stages": list(child.plan.stages)})
            await self._spawn(child)
        await self._wait_ready(children, report=True)

    async def _wait_ready(self, children: list[Child], *, report: bool = False) -> None:
        """Until every child of ``children`` is ready; StartupError with each one's failure.

        A failed rank of a tensor-parallel group stops its siblings at once: they
        would wait at the rendezvous until runtime.startup_timeout, and the error
        says which rank failed rather than that the others timed out.
        """
        errors: list[str] = []
        stopped: dict[str, str] = {}  # TP ranks stopped because another rank failed: why

        async def wait(child: Child) -> None:
            try:
                await child.wait_ready(self.config.runtime.startup_timeout)
                if report:
                    self.on_progress(
                        "ready",
                        child.name,
                        {"seconds": child.ready_seconds, "stages": child.timings},
                    )
            except StartupError as exc:
                if child.name in stopped:
                    errors.append(f"process {child.name} was stopped: {stopped[child.name]}")
                    return
                errors.append(exc.render())
                for sibling in self._tp_siblings(child):
                    if sibling.name not in stopped and sibling.state in ("starting", "restarting"):
                        stopped[sibling.name] = (
                            f"rank {child.plan.tp_rank} ({child.name}) of its tensor-parallel "
                            "group failed to start"
                        )
                        await sibling.stop(kill=True)

        async with anyio.create_task_group() as tg:
            for child in children:
                tg.start_soon(wait, child)
        if errors:
            raise StartupError("\n\n".join(errors))

    async def _spawn(self, child: Child) -> None:
        await child.spawn(self._spec(child), self.session.process(child.name, child.log_path))

    def _spec(self, child: Child) -> ChildSpec:
        daemon = self.mps.get(child.plan.gpu) if child.plan.gpu is not None else None
        return ChildSpec(
            process=child.name,
            plan=self.plan,
            config=self.config,
            parent_pid=os.getpid(),
            log_path=child.log_path,
            plugin_modules=self.plugin_modules,
            extra_env=daemon.client_env() if daemon else {},
            secret=self.secret,
            addresses=dict(self.links.addresses),
            tp_store=self._tp_store(child),
        )

    def _tp_siblings(self, child: Child) -> list[Child]:
        """The other ranks of ``child``'s tensor-parallel group (none for other processes)."""
        if child.plan.tp_rank is None:
            return []
        key = (child.plan.logical, child.plan.replica)
        return [
            c
            for c in self.children.values()
            if c is not child and (c.plan.logical, c.plan.replica) == key
        ]

    def _tp_store(self, child: Child) -> str:
        """The rendezvous file of this start of ``child``'s TP group ('' outside one).

        Rank 0 is spawned first (plan order, at start and at every restart) and
        opens a new generation, so a rank left over from an earlier start can
        never meet the new group.
        """
        plan = child.plan
        if plan.tp_rank is None:
            return ""
        key = (plan.logical, plan.replica)
        if plan.tp_rank == 0:
            self._tp_generations[key] = self._tp_generations.get(key, 0) + 1
        generation = self._tp_generations.get(key, 1)
        name = f"tp-{plan.logical}-r{plan.replica}-g{generation}.store"
        return os.path.join(self.plan.endpoints.runtime_dir, name)

    async def aclose(self, grace: float | None = None) -> None:
        """Stop admitting, let in-flight requests finish (grace), stop children, clean up."""
        grace = self.config.runtime.grace_period if grace is None else grace
        self.coordinator.accepting = False
        cancelled: BaseException | None = None
        try:
            with anyio.move_on_after(grace):
                while self.coordinator.inflight:
                    await anyio.sleep(0.02)
        except anyio.get_cancelled_exc_class() as exc:
            # The caller is being cancelled (a signal during start-up, say): skip the
            # grace period, but still stop everything below, then let it propagate.
            cancelled = exc
        if self._tg is not None:  # first the monitor, so that nothing is restarted
            self._tg.cancel_scope.cancel()
            try:
                await self._tg.__aexit__(None, None, None)
            except anyio.get_cancelled_exc_class() as exc:
                # Entered in start(), under the caller's scope, the group re-raises the
                # caller's cancellation when it exits: stop everything first.
                cancelled = cancelled or exc
            self._tg = None
        with anyio.CancelScope(shield=True):
            for handle in list(self.coordinator.requests.values()):
                await self._abort_everywhere(handle)
                self.coordinator.abort(handle, "the server stopped before the request finished")
            for child in self.children.values():
                await self._stop_child(child)
            for daemon in self.mps.values():  # after the last client stopped
                await anyio.to_thread.run_sync(daemon.stop)
            await self.session.aclose()  # after the last process: nothing survives
            await self.outbound.aclose()
            for inbox in self.inboxes:
                await inbox.aclose()
            self.inboxes = []
        if self._owns_dir:  # never a directory we refused, or another runtime's
            shutil.rmtree(self.plan.endpoints.runtime_dir, ignore_errors=True)
            self._owns_dir = False
        if cancelled is not None:
            raise cancelled

    # -- requests -------------------------------------------------------------
    async def dispatch(self, data: Any, params: dict[str, Any] | None = None) -> RequestHandle:
        """Route a request into the stage graph; its handle streams what the stages emit."""
        return await self.coordinator.track(data, params)

    async def abort(self, handle: RequestHandle, reason: str = "aborted by the client") -> None:
        await self._abort_everywhere(handle)
        self.coordinator.abort(handle, reason)

    async def run(
        self, data: Any, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """Submit and wait; abort everywhere on timeout or cancellation."""
        handle = await self.dispatch(data, params)
        timeout = self.config.runtime.request_timeout if timeout is None else timeout
        try:
            with anyio.fail_after(timeout):
                return await handle.result()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.abort(handle, "timed out or cancelled")
            raise

    async def _abort_everywhere(self, handle: RequestHandle) -> None:
        envelope = m.Envelope(m.ABORT, handle.request_id)
        for process in sorted({self.table.leaders[k] for k in handle.binding.items()}):
            child = self.children[process]
            if child.state == "healthy":
                # A process that cannot be told is being restarted or is gone.
                with contextlib.suppress(Exception):
                    await self._send(process, envelope)

    async def _send_from_coordinator(self, envelope: m.Envelope) -> None:
        await self._send(self.table.process_for(envelope.target, envelope.binding), envelope)

    async def _send(self, process: str, envelope: m.Envelope) -> None:
        name, address = self.links.route(None, process)
        transport = self.plugins.transport(name)
        await self.outbound.send(
            (name, address),
            lambda: transport.connect(address, secret=self.secret),
            envelope,
        )

    async def _receive(self, inbox: Any) -> None:
        # A request can end while stages of it still run: a terminal stage that
        # stopped reading its input stream early (a stop string was hit), or a
        # failure in one branch of a fan-out. Their work is wasted and holds
        # slots, so an ended request is aborted everywhere it was bound (an
        # abort for work already finished costs one small message, no more).
        leftovers = any(s.stream_to for s in self.config.stages)
        while True:
            envelope = await inbox.recv()
            handle = self.coordinator.requests.get(envelope.request_id)
            self.coordinator.on_envelope(envelope)
            if handle is not None and handle.done.is_set() and (leftovers or handle.error):
                self._tg.start_soon(self._abort_everywhere, handle)

    # -- supervision ----------------------------------------------------------
    async def _monitor(self) -> None:
        timeout = self.config.runtime.heartbeat_timeout
        tick = time.monotonic()
        while True:
            now = time.monotonic()
            if now - tick > timeout / 2:
                # This loop itself was held up (a busy parent): heartbeats may be
                # waiting unread in the inbox. Give every child a fresh timeout
                # rather than blame it for our delay.
                self._heard_floor = now
            tick = now
            for child in self.children.values():
                if child.state != "healthy":
                    continue
                if not child.proc.is_alive():
                    reason = f"process {child.name} {describe_exit(child.proc.exitcode)}"
                    child.state = "restarting"
                    for sibling in self._tp_siblings(child):
                        # Its ranks restart with it: a rank that the break made exit
                        # must not start a second restart (or be named instead of it).
                        sibling.state = "restarting"
                    self._tg.start_soon(self._restart, child, reason, "died")
                    continue
                silent = now - self.last_heartbeat(child)
                if silent > timeout:
                    reason = (
                        f"process {child.name} is unresponsive: no heartbeat for {silent:.1f} s "
                        f"(runtime.heartbeat_timeout is {timeout:g} s); it was killed"
                    )
                    child.state = "unresponsive"
                    self._tg.start_soon(self._restart, child, reason, "unresponsive")
            await anyio.sleep(0.05)

    def last_heartbeat(self, child: Child) -> float:
        """When ``child`` was last heard of: its last heartbeat, or when it became ready."""
        heard = self.coordinator.heartbeats.get(child.name, 0.0)
        return max(child.ready_at, heard, self._heard_floor)

    def _share_group(self, process: str) -> Any:
        """The weight-sharing group ``process`` leads or follows in, or None."""
        for group in self.plan.weight_share.groups:
            if process == group.leader or process in group.followers:
                return group
        return None

    def _restart_waves(self, failed: Child) -> list[list[Child]]:
        """The processes that restart with ``failed``, in start-up order.

        Its replica's processes (a TP group's ranks); and when it leads a
        weight-sharing group, its followers after it: they map the leader's
        memory, so a new leader needs followers that map the new copy.
        """

        def replica_of(name: str) -> list[Child]:
            key = (self.children[name].plan.logical, self.children[name].plan.replica)
            return [c for c in self.children.values() if (c.plan.logical, c.plan.replica) == key]

        waves = [replica_of(failed.name)]
        share = self._share_group(failed.name)
        if share is not None and share.leader == failed.name:
            waves.append([c for name in share.followers for c in replica_of(name)])
        return waves

    async def _restart(self, failed: Child, reason: str, event: str) -> None:
        """Fail the group's requests, stop it, and start it again with back-off.

        ``event`` is "died" or "unresponsive": an unresponsive group keeps that
        state in /health until it is started again, and is killed at once
        (a hung process would not handle SIGTERM). A weight-sharing leader
        restarts with its followers (leader first); restarts within one
        sharing group take turns.
        """
        waves = self._restart_waves(failed)
        group = [c for wave in waves for c in wave]
        waiting = "unresponsive" if event == "unresponsive" else "restarting"
        for child in group:  # at once: the monitor must not restart them on its own
            child.state = waiting
        keys = list(dict.fromkeys((c.plan.logical, c.plan.replica) for c in group))
        for key in keys:
            self.coordinator.unavailable[key] = reason
            for handle in self.coordinator.fail_process(*key, reason):
                # Its other stages, in processes still alive, would run on for nobody.
                self._tg.start_soon(self._abort_everywhere, handle)
        self.on_progress(event, failed.name, {"reason": reason})
        share = self._share_group(failed.name)
        lock = self._share_locks[share.leader] if share is not None else anyio.Lock()
        async with lock:
            for child in group:
                child.state = waiting
                child.last_exit = reason
                await self._stop_child(child, kill=event == "unresponsive")
                child.state = waiting
            await self._start_again(failed, waves, keys, reason)

    async def _start_again(
        self, failed: Child, waves: list[list[Child]], keys: list[Any], reason: str
    ) -> None:
        group = [c for wave in waves for c in wave]
        attempts = self.config.runtime.restart_attempts
        for attempt in range(1, attempts + 1):
            await anyio.sleep(self.config.runtime.restart_backoff * 2 ** (attempt - 1))
            try:
                for wave in waves:
                    for child in wave:
                        child.restarts += 1
                        await self._spawn(child)
                        child.state = "restarting"
                    await self._wait_ready(wave)
            except StartupError as exc:
                self.on_progress(
                    "restart-failed", failed.name, {"attempt": attempt, "error": exc.message}
                )
                for child in group:
                    await self._stop_child(child)
                    child.state = "restarting"
                continue
            for key in keys:
                self.coordinator.unavailable.pop(key, None)
            self.on_progress("restarted", failed.name, {"attempt": attempt})
            return
        for child in group:
            child.state = "failed"
        for key in keys:
            self.coordinator.unavailable[key] = (
                f"{reason}; {attempts} restart attempt{'s' if attempts != 1 else ''} failed"
            )
        self.on_progress("failed", failed.name, {"reason": self.coordinator.unavailable[keys[0]]})

    async def _stop_child(self, child: Child, *, kill: bool = False) -> None:
        """Stop ``child``; with weight sharing, then remove what torch left in /dev/shm for it."""
        pid = getattr(child.proc, "pid", None) if child.proc is not None else None
        await child.stop(kill=kill)
        if self.plan.weight_share.groups and pid is not None:
            remove_leftovers(pid)

    # -- state ----------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        groups = {}
        for child in self.children.values():
            state = child.state
            if (child.plan.logical, child.plan.replica) in self.coordinator.unavailable:
                # Ready again but its restart not finished: admission still refuses it, so
                # /health must not say healthy yet (a client would be refused after it).
                state = "restarting" if state == "healthy" else state
            groups[child.name] = {
                "state": state,
                "stages": list(child.plan.stages),
                "node": child.plan.node,
                **(child.proc.where() if child.proc is not None else {}),
                "restarts": child.restarts,
                "weight_share": child.plan.weight_share,  # leader, follower or none
                "last_exit": child.last_exit or None,
                "heartbeat_age_seconds": round(time.monotonic() - self.last_heartbeat(child), 3)
                if state == "healthy"
                else None,
                "cold_start_seconds": child.timings,
                "queue": self.coordinator.stage_stats.get(child.name, {})
                if state == "healthy"
                else {},
                "runs": self.coordinator.stage_runs.get(child.name, {})
                if state == "healthy"
                else {},
                "received": self.coordinator.received.get(child.name, {}),
            }
        states = {g["state"] for g in groups.values()}
        if not self.coordinator.accepting:
            status = "stopping"
        elif not self.ready:
            status = "starting"
        elif states <= {"healthy"}:
            status = "healthy"
        elif "failed" in states:
            status = "unhealthy"
        else:
            status = "degraded"
        return {
            "status": status,
            "inflight": self.coordinator.inflight,
            "max_inflight": self.coordinator.max_inflight,
            "processes": groups,
        }
