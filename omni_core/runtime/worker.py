"""The child process: build this process's stages, then serve its inbox.

Every stage of the process runs on one anyio event loop; a request's parts
move between them as Python objects, and to other processes through the
edge's transport. One task per (request, stage): a stage that batches sees
its concurrent calls and serves them together.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import inspect
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..engine.compute import dedicate
from ..engine.heap import return_freed_memory
from ..errors import OmniError, RequestError
from ..factory import StageContext, import_object
from ..plan.model import DeploymentPlan
from ..plan.threads import apply_cpu_threads
from ..plugins import OmniPlugins
from ..schema import PipelineConfig
from ..transport import ChannelClosed
from ..wire import allow_wire_types
from . import messages as m
from .graph import StageGraph
from .links import Links
from .outbound import Outbound
from .pids import running
from .routing_table import RoutingTable
from .rundir import open_private
from .stage_api import StageRequest, as_stage
from .weight_share import activate, role_in_plan, serve

HEARTBEATS_PER_TIMEOUT = 5  # a process falls silent only after missing this many in a row
MAX_HEARTBEAT_INTERVAL = 1.0  # seconds; the queue depth in /health is at most this old
# Requests (and request streams) that ended here, remembered so that whatever of theirs
# arrives late is dropped instead of starting a run nobody will end. Bounded: a message
# can only be late by the time it spends in a socket, far less than this many requests.
ENDED_REMEMBERED = 65536


class StageUnreachable(OmniError):
    """A request's next stage lives in a process that is down (the API answers 503)."""


@dataclass
class ChildSpec:
    """Everything a child needs; pickled into the pipe that starts it (fork server or spawn)."""

    process: str
    plan: DeploymentPlan
    config: PipelineConfig
    parent_pid: int
    log_path: str
    plugin_modules: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)  # set by the runtime (MPS pipes)
    # The deployment's secret: crosses to the child inside the start pipe, never
    # through a file or the environment, and is never printed.
    secret: bytes = field(default=b"", repr=False)
    # Multi-node launchers: the TCP addresses they reserved (process name, and
    # "coordinator"), and cluster GPU ids renumbered as this process sees them.
    addresses: dict[str, str] = field(default_factory=dict)
    gpu_map: dict[int, int] = field(default_factory=dict)
    # A tensor-parallel rank: the rendezvous file of this start of its group (private to
    # the run's directory, fresh for each restart), see omni_core.engine.tp.group.
    tp_store: str = ""


def _engine_counts(stage: Any) -> dict[str, int]:
    """An engine stage's scheduler counts (``engine_running``/``engine_waiting``), as its
    engine reports them (SGLang's scheduler, or omni's torch engine); none for others."""
    engine = getattr(stage, "engine", None)
    try:
        running, waiting = engine.num_running, engine.num_waiting  # type: ignore[union-attr]
    except Exception:
        return {}
    if not isinstance(running, int) or not isinstance(waiting, int):
        return {}
    return {"engine_running": running, "engine_waiting": waiting}


def _prompt_counts(stage: Any) -> dict[str, int]:
    """A torch engine stage's prompt positions computed and copied from a cached prefix
    (``prompt_computed``/``prompt_cached``), its chunks of long prompts
    (``prefill_chunks``) and its decode steps that missed every compiled graph
    (``compiled_misses``), cumulative; none for other stages."""
    engine = getattr(stage, "engine", None)
    prompts = getattr(engine, "prompt_positions", None)
    if not isinstance(prompts, dict):
        return {}
    counts = {f"prompt_{source}": int(n) for source, n in prompts.items()}
    chunks = getattr(engine, "prefill_chunks", None)
    if isinstance(chunks, int):
        counts["prefill_chunks"] = chunks
    misses = getattr(engine, "compiled_misses", None)
    if isinstance(misses, int):
        counts["compiled_misses"] = misses
    return counts


def child_main(spec: ChildSpec, conn: Any, environ: dict[str, str] | None = None) -> None:
    """Entry point of a stage process.

    ``environ``: the parent's environment when it started this process. A process forked
    from the fork server inherited the server's, which may be older (see
    ``launchers.local.start_method``); it takes the parent's, as a spawned one would.
    """
    if environ is not None and environ != os.environ:
        os.environ.clear()
        os.environ.update(environ)
    _die_with_parent(spec.parent_pid)
    _redirect_output(spec.log_path)
    process = spec.plan.process(spec.process)
    for key, value in {**process.env, **spec.extra_env}.items():
        os.environ.setdefault(key, value)  # the user's environment always wins
    try:
        anyio.run(_run_child, spec, conn)
    except KeyboardInterrupt:
        pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


async def _run_child(spec: ChildSpec, conn: Any) -> None:
    worker = Worker(spec)
    try:
        timings = await worker.build()
        apply_cpu_threads(worker.process)  # the plan's core budget (plan/threads.py)
        # ... given to the compute thread, the only OpenMP team (engine/compute.py)
        dedicate(worker.process.cpu_threads)
        await worker.listen()
    except BaseException:
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        conn.send(("failed", text))
        await worker.aclose()
        return
    conn.send(("ready", timings))
    print(f"process {spec.process} ready: {timings}", flush=True)
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as tg:
            worker.tg = tg
            tg.start_soon(worker.serve)

            async def stop_on_signal() -> None:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

            tg.start_soon(stop_on_signal)
    await worker.aclose()


class Worker:
    """The stages of one process and the requests they are working on."""

    def __init__(self, spec: ChildSpec):
        self.spec = spec
        self.plan, self.config = spec.plan, spec.config
        self.graph = StageGraph.of(spec.config)
        self.table = RoutingTable.of(spec.plan, spec.config)
        self.plugins = OmniPlugins()
        for name in spec.plugin_modules:
            if name not in self.plugins.records:
                self.plugins.register(importlib.import_module(name), name=name)
        allow_wire_types(self.plugins.wire_types())
        self.process = spec.plan.process(spec.process)
        self.links = Links(spec.plan, spec.config, spec.addresses)
        self.stages: dict[str, Any] = {}
        self.inboxes: list[Any] = []
        self.inbox_transports: dict[int, str] = {}  # id(inbox) -> transport name
        self.received: dict[str, int] = {}  # transport -> messages it brought in
        self.outbound = Outbound()
        self.tg: TaskGroup | None = None
        self.scopes: dict[str, set[anyio.CancelScope]] = {}
        self.fanin: dict[tuple[str, str], dict[str, Any]] = {}
        # (request, stage) -> the stage run's input stream: (send side, receive side)
        self.streams: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.ended = Remembered(ENDED_REMEMBERED)  # request ids aborted here
        self.ended_streams = Remembered(ENDED_REMEMBERED)  # (request, stage) streams closed
        self.dropped = 0  # late messages of ended requests, dropped
        self.running: dict[str, int] = {}  # stage -> requests it is working on
        self.runs: dict[str, tuple[int, float]] = {}  # stage -> (runs ended, their seconds)
        self._imports: dict[str, Callable[..., Any]] = {}
        # Weight sharing: the stage factories load through share_weights(), which reads this.
        self.share = role_in_plan(spec.plan, spec.process, spec.secret)
        self.weight_server: Any = None

    # -- start-up -----------------------------------------------------------
    async def build(self) -> dict[str, float]:
        """Build the stages in declaration order; construction on a GPU holds its lock."""
        timings: dict[str, float] = {}
        if self.process.tp_rank is not None:
            started = time.perf_counter()
            await anyio.to_thread.run_sync(self._join_tp_group)
            timings["tp_rendezvous"] = round(time.perf_counter() - started, 4)
        activate(self.share)
        for instance in self.process.stages:
            placement = self.plan.stage(instance)
            stage = self.config.stage(placement.stage)
            context = StageContext(
                instance=instance,
                process=self.process.name,
                replica=placement.replica,
                tp_rank=self.process.tp_rank or 0,
                tp_size=placement.tp_size,
                gpu_ids=tuple(self.spec.gpu_map.get(g, g) for g in placement.gpus),
                gpu_memory_fraction=placement.gpu_memory_fraction,
                total_reserve_bytes=placement.total_reserve_bytes,
                running_requests=self.plan.running_requests.get(placement.stage),
            )
            started = time.perf_counter()
            with _gpu_locks(self.plan.endpoints.runtime_dir, placement.gpus):
                built = self.plugins.build_stage(stage, self.config, context)
                obj = as_stage(built, name=stage.name)
                start = getattr(obj, "start", None)
                if start is not None:
                    result = start()
                    if inspect.isawaitable(result):
                        await result
            timings[stage.name] = round(time.perf_counter() - started, 4)
            self.stages[stage.name] = obj
        self._check_shared()
        self.weight_server = serve(self.share)
        # What loading and converting weights freed goes back to the system before
        # the process says ready (engine/heap.py).
        return_freed_memory()
        return timings

    def _check_shared(self) -> None:
        """A sharing group whose stages never loaded through share_weights shares nothing."""
        if self.share.kind == "none" or self.share.published or self.share.mapped:
            return
        raise OmniError(
            f"weight_share = on: process {self.process.name} is the weight-sharing "
            f"{self.share.kind} of its group, but none of its stage factories loaded weights "
            "through omni_core.runtime.weight_share.share_weights, so nothing can be shared",
            hint='set weight_share = "off", or load the model through share_weights '
            "(CONTRIBUTING: weight sharing)",
        )

    def _join_tp_group(self) -> None:
        """Form this rank's tensor-parallel group before any stage is built (blocking).

        gloo on the CPU (its sockets on the loopback interface: the ranks share a
        host), NCCL when the ranks have GPUs; the factories find the group through
        ``omni_core.engine.tp.current_group()``.
        """
        from ..engine.tp import init_group

        process = self.process
        ranks = sorted(
            (p for p in self.plan.processes if _same_group(p, process)),
            key=lambda p: p.tp_rank or 0,
        )
        if process.gpu is None:
            backend, device = "gloo", "cpu"
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        else:
            backend, device = "nccl", f"cuda:{self.spec.gpu_map.get(process.gpu, process.gpu)}"
        name = process.logical
        if process.num_replicas > 1:
            name = f"{name}@r{process.replica}"
        init_group(
            name=name,
            rank=process.tp_rank or 0,
            size=process.tp_size,
            store_path=self.spec.tp_store,
            backend=backend,
            device=device,
            timeout=self.config.runtime.startup_timeout,
            ranks=[p.name for p in ranks],
        )

    async def listen(self) -> None:
        for name, address in self.links.listens(self.process.name, list(self.stages)):
            transport = self.plugins.transport(name)
            inbox = transport.listen(address, secret=self.spec.secret)
            self.inbox_transports[id(inbox)] = name
            self.inboxes.append(inbox)

    # -- serving ------------------------------------------------------------
    async def serve(self) -> None:
        async with anyio.create_task_group() as tg:
            for inbox in self.inboxes:
                tg.start_soon(self._serve_inbox, inbox)
            tg.start_soon(self._heartbeat)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per stage: requests running in it, and fan-in requests waiting for sources."""
        waiting: dict[str, int] = {}
        for _, stage in self.fanin:
            waiting[stage] = waiting.get(stage, 0) + 1
        out = {
            stage: {"running": self.running.get(stage, 0), "waiting": waiting.get(stage, 0)}
            for stage in self.stages
        }
        for stage, obj in self.stages.items():
            out[stage].update(_engine_counts(obj))
        return out

    def run_stats(self) -> dict[str, dict[str, float]]:
        """Per stage: runs that ended (however they ended) and the seconds they took in total
        (and an engine stage's prompt positions computed and copied).

        Cumulative over this process's life, so that the parent can expose
        them as a Prometheus summary: a rate of the sum over a rate of the
        count is the mean time a request spends in the stage.
        """
        stats: dict[str, dict[str, float]] = {}
        for stage, obj in self.stages.items():
            count, seconds = self.runs.get(stage, (0, 0.0))
            stats[stage] = {"count": count, "seconds": seconds, **_prompt_counts(obj)}
        return stats

    async def _heartbeat(self) -> None:
        """Tell the coordinator, from this event loop, that the process is alive.

        Sent from the loop, not from a thread: a loop that is blocked (a stage
        computing without yielding, a deadlock, SIGSTOP) goes silent, and the
        supervisor treats silence as a hang. Each heartbeat carries the
        stages' queue depth and run times, which /health and /metrics show,
        and how many messages each transport brought in (which one really ran).
        """
        timeout = self.config.runtime.heartbeat_timeout
        interval = min(timeout / HEARTBEATS_PER_TIMEOUT, MAX_HEARTBEAT_INTERVAL)
        while True:
            with contextlib.suppress(Exception):  # the coordinator may be stopping
                stats = {
                    "queue": self.stats(),
                    "runs": self.run_stats(),
                    "received": dict(self.received),
                }
                await self._send(m.Envelope(m.HEARTBEAT, "", "", self.process.name, stats))
            await anyio.sleep(interval)

    async def _serve_inbox(self, inbox: Any) -> None:
        name = self.inbox_transports.get(id(inbox), "?")
        while True:
            envelope = await inbox.recv()
            self.received[name] = self.received.get(name, 0) + 1
            await self.dispatch(envelope)

    async def dispatch(self, env: m.Envelope) -> None:
        """Hand one message to its stage; a message that fails fails its request only."""
        if env.kind == m.ABORT:
            self._abort(env.request_id)
            return
        if env.request_id in self.ended:
            # Chunks in flight, the other branches' outputs, a fan-in's late part:
            # the request is over here, and nothing of it may start a run again.
            self.dropped += 1
            return
        try:
            if env.kind == m.DELIVER:
                await self._deliver(env)
            elif env.kind in (m.CHUNK, m.END):
                await self._stream(env)
        except Exception as exc:  # a merge function's error, a broken route: this request's
            await self._fail_quietly(env, env.target, exc)

    async def _deliver(self, env: m.Envelope) -> None:
        stage = self.config.stage(env.target)
        if not stage.wait_for:
            self._start(env.target, env, env.data, None)
            return
        key = (env.request_id, env.target)
        parts = self.fanin.setdefault(key, {})
        parts[env.source] = env.data
        expected = self.graph.expected_sources(env.target, env.skipped)
        if expected <= parts.keys():
            del self.fanin[key]
            merge = self._import(stage.merge_fn, f"stage {stage.name!r} merge_fn")
            self._start(env.target, env, merge({k: parts[k] for k in sorted(expected)}), None)

    async def _stream(self, env: m.Envelope) -> None:
        key = (env.request_id, env.target)
        if key in self.ended_streams:
            # The run this stream fed has ended (it stopped reading early, or failed);
            # the rest of the stream has nobody to read it.
            self.dropped += 1
            return
        pair = self.streams.get(key)
        if pair is None:
            pair = anyio.create_memory_object_stream[Any](64)
            self.streams[key] = pair
            self._start(env.target, env, None, _iterate(pair[1]))
        sender = pair[0]
        if env.kind == m.CHUNK:
            try:
                await sender.send(env.data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.dropped += 1  # the run ended while this chunk waited for room
        else:
            self.streams.pop(key, None)
            sender.close()

    def _start(self, stage: str, env: m.Envelope, data: Any, stream: Any) -> None:
        assert self.tg is not None
        self.tg.start_soon(self._run, stage, env, data, stream)

    async def _run(self, name: str, env: m.Envelope, data: Any, stream: Any) -> None:
        if env.request_id in self.ended:  # aborted between being scheduled and starting
            self._close_stream(env.request_id, name)
            return
        stage = self.config.stage(name)
        scope = anyio.CancelScope()
        self.scopes.setdefault(env.request_id, set()).add(scope)
        skips: set[str] = set()  # targets this stage said it will send nothing to
        emit = self._emitter(name, env, skips) if stage.stream_to or stage.terminal else None
        request = StageRequest(
            env.request_id, data, env.params, stream, emit, self._skipper(name, env, skips)
        )
        self.running[name] = self.running.get(name, 0) + 1
        started = time.perf_counter()
        try:
            with scope:
                try:
                    result = await self.stages[name].run(request)
                    await self._forward(name, env, result, skips)
                except Exception as exc:  # fails this request only, never the process
                    await self._fail(env, name, exc)
        finally:
            self.running[name] -= 1
            count, seconds = self.runs.get(name, (0, 0.0))
            self.runs[name] = (count + 1, seconds + time.perf_counter() - started)
            scopes = self.scopes.get(env.request_id)
            if scopes is not None:
                scopes.discard(scope)
                if not scopes:
                    del self.scopes[env.request_id]
            if stream is not None:
                self._close_stream(env.request_id, name)

    def _close_stream(self, request_id: str, stage: str) -> None:
        """Close a run's input stream for good: its later chunks are dropped, and a
        chunk waiting for room is released instead of holding the inbox forever."""
        key = (request_id, stage)
        self.ended_streams.add(key)
        pair = self.streams.pop(key, None)
        if pair is not None:
            pair[0].close()
            pair[1].close()

    def _skipper(self, name: str, env: m.Envelope, skips: set[str]) -> Callable[[Any], Any]:
        stage = self.config.stage(name)

        async def skip(targets: tuple[str, ...]) -> None:
            unknown = [t for t in targets if t not in stage.targets]
            if unknown:
                raise ValueError(
                    f"stage {name!r} cannot skip {unknown}: not among its targets "
                    f"({', '.join(stage.targets)})"
                )
            before = self.graph.skip_closure(env.skipped | skips)
            skips.update(targets)
            after = self.graph.skip_closure(env.skipped | skips)
            if after != before:
                await self._send(m.Envelope(m.SKIPPED, env.request_id, "", name, skipped=after))

        return skip

    def _emitter(self, name: str, env: m.Envelope, skips: set[str]) -> Callable[[Any], Any]:
        stage = self.config.stage(name)

        async def emit(chunk: Any) -> None:
            skipped = self.graph.skip_closure(env.skipped | skips) if skips else env.skipped
            for target in stage.stream_to:
                if target in skips:
                    continue
                await self._send(
                    m.Envelope(
                        m.CHUNK,
                        env.request_id,
                        target,
                        name,
                        chunk,
                        env.params,
                        env.binding,
                        skipped,
                    )
                )
            if stage.terminal:
                await self._send(m.Envelope(m.OUTPUT_CHUNK, env.request_id, "", name, chunk))

        return emit

    async def _forward(
        self,
        name: str,
        env: m.Envelope,
        result: Any,
        skips: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        stage = self.config.stage(name)
        if stage.terminal:
            await self._send(m.Envelope(m.OUTPUT, env.request_id, "", name, result))
            return
        chosen = stage.targets
        if stage.route_fn:
            route = self._import(stage.route_fn, f"stage {name!r} route_fn")
            chosen = list(route(result))
            undeclared = [t for t in chosen if t not in stage.targets]
            if undeclared:
                raise RuntimeError(
                    f"route function of stage {name!r} returned {undeclared}, which are not "
                    f"declared targets ({', '.join(stage.targets)})"
                )
        chosen = [t for t in chosen if t not in skips]
        skipped = self.graph.skip_closure(env.skipped | (set(stage.targets) - set(chosen)))
        if skipped != self.graph.skip_closure(env.skipped | skips):  # skip() said the rest
            await self._send(m.Envelope(m.SKIPPED, env.request_id, "", name, skipped=skipped))
        for target in chosen:
            kind, data = (m.END, None) if target in stage.stream_to else (m.DELIVER, result)
            await self._send(
                m.Envelope(
                    kind, env.request_id, target, name, data, env.params, env.binding, skipped
                )
            )

    async def _fail(self, env: m.Envelope, name: str, exc: BaseException) -> None:
        text = exc.render() if isinstance(exc, RequestError) else f"{type(exc).__name__}: {exc}"
        detail = "".join(traceback.format_exception(exc)).rstrip()
        print(
            f"request {env.request_id} failed in stage {name}:\n{detail}",
            file=sys.stderr,
            flush=True,
        )
        await self._send(
            m.Envelope(
                m.FAILED,
                env.request_id,
                "",
                name,
                error=text,
                client_error=isinstance(exc, RequestError),
                process_lost=isinstance(exc, StageUnreachable),
                process=self.process.name,
                detail="" if isinstance(exc, RequestError | StageUnreachable) else detail,
            )
        )

    async def _fail_quietly(self, env: m.Envelope, name: str, exc: BaseException) -> None:
        """Fail ``env``'s request for an error outside a stage run; never raise from here."""
        with contextlib.suppress(Exception):
            await self._fail(env, name, exc)

    def _abort(self, request_id: str) -> None:
        self.ended.add(request_id)
        for scope in self.scopes.pop(request_id, set()):
            scope.cancel()
        for key in [k for k in self.fanin if k[0] == request_id]:
            del self.fanin[key]
        for key in [k for k in self.streams if k[0] == request_id]:
            self._close_stream(*key)

    # -- sending ------------------------------------------------------------
    async def _send(self, env: m.Envelope) -> None:
        if env.target and env.target in self.stages:
            await self.dispatch(env)
            return
        if env.target:
            target = self.table.process_for(env.target, env.binding)
            edge = (env.source, env.target)
            transport, address = self.links.route(self.process.name, target, edge)
        else:
            transport, address = self.links.route(self.process.name, None)
        try:
            await self.outbound.send(
                (transport, address),
                lambda: self.plugins.transport(transport).connect(address, secret=self.spec.secret),
                env,
            )
        except (ChannelClosed, OSError) as exc:
            if not env.target:
                raise
            process = self.table.process_for(env.target, env.binding)
            raise StageUnreachable(
                f"stage {env.target!r} cannot be reached: process {process} is not serving "
                f"({type(exc).__name__}); it may be restarting"
            ) from exc

    def _import(self, path: str | None, what: str) -> Callable[..., Any]:
        assert path is not None
        if path not in self._imports:
            self._imports[path] = import_object(path, what=what)
        return self._imports[path]

    async def aclose(self) -> None:
        if self.weight_server is not None:
            self.weight_server.close()
        for stage in self.stages.values():
            close = getattr(stage, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()
        with anyio.CancelScope(shield=True):
            await self.outbound.aclose()
        for channel in self.inboxes:
            with anyio.CancelScope(shield=True):
                await channel.aclose()
        if self.process.tp_rank is not None:
            from ..engine.tp import leave_group

            leave_group()  # torch's process group must not outlive the interpreter


def _same_group(a: Any, b: Any) -> bool:
    """Two processes are ranks of one tensor-parallel group."""
    return a.tp_rank is not None and (a.logical, a.replica) == (b.logical, b.replica)


class Remembered:
    """The last ``capacity`` keys added, for membership tests; the oldest are forgotten."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._keys: dict[Any, None] = {}  # insertion-ordered

    def add(self, key: Any) -> None:
        self._keys.pop(key, None)
        self._keys[key] = None
        if len(self._keys) > self.capacity:
            del self._keys[next(iter(self._keys))]

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)


async def _iterate(receiver: Any):
    async with receiver:
        async for item in receiver:
            yield item


@contextmanager
def _gpu_locks(runtime_dir: str, gpus: tuple[int, ...]):
    """Serialise stage construction per GPU across processes (memory sizing races)."""
    handles = []
    try:
        for gpu in sorted(gpus):
            lock = os.path.join(runtime_dir, f"gpu{gpu}.lock")
            handle = open_private(lock, os.O_RDWR | os.O_CREAT)
            handles.append(handle)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        for handle in reversed(handles):
            fcntl.flock(handle, fcntl.LOCK_UN)
            os.close(handle)


def _die_with_parent(parent_pid: int) -> None:
    """No orphan survives the parent, even a SIGKILLed one.

    The direct parent is ``parent_pid`` (spawned) or the fork server it started, which
    ends as soon as that parent does (its end of a pipe closes); the kernel kills this
    process when the direct parent ends, and a thread also watches both, in case either
    was already gone before the kernel was asked.
    """
    direct = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    def orphaned() -> bool:
        return os.getppid() != direct or not running(parent_pid)

    if orphaned():  # a parent died before prctl took effect
        os._exit(1)

    def watch() -> None:  # the portable fallback
        while True:
            time.sleep(1.0)
            if orphaned():
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _redirect_output(path: str) -> None:
    # The parent created and checked the directory; on another node (Ray) it may not exist.
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    log = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
