"""``ray``: the plan's process groups as actors in one placement group on a Ray cluster.

``omni serve`` joins a running cluster (``ray.address`` / ``--ray-address``,
else ``$RAY_ADDRESS``) or, when ``ray.start_local`` is set, starts a one-node
cluster of its own. The plan is placed as one placement group:

* one bundle per GPU the plan uses (``{"GPU": 1, "CPU": ...}``), holding
  every process of that GPU, and one bundle per CPU-only process;
* each bundle is pinned to the node the planner chose for it (the
  ``ray.io/node-id`` label), under the deploy file's strategy (``pack`` or
  ``spread``), so what ``omni plan`` printed is what runs;
* each process group runs as a :class:`~.ray_actor.ProcessGroupActor` named
  ``omni-<deployment>-<run>-<process>`` (readable in Ray's dashboard) in its
  bundle; the actor spawns the ordinary child process on its node. The
  placement group is named ``omni-<deployment>-<run>``.

The runtime supervises actors as it supervises local children: an actor or
child that dies fails its requests and is started again (a new actor in the
same bundle when the actor itself is gone). Closing the session kills every
actor and removes the placement group; a cluster this session started is
stopped. The parent's Ray connection lives as long as the session.

Node names: a node's ``omni-node`` label (``ray start --labels
'{"omni-node": "gpu-a"}'``) where it has one, else ``node-<first 8 hex of its
id>``; the node ``omni serve`` runs on comes first and holds the coordinator.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import anyio

from ...errors import ConfigError, OmniError
from ...launcher import Launcher, LaunchSession, ProcessHandle
from ...placement import ClusterNode, GpuDevice, GpuInventory
from ...sigterm import signal_handlers_kept

T = TypeVar("T")

NODE_LABEL = "omni-node"
NODE_ID_LABEL = "ray.io/node-id"
EVENT_WAIT = 0.5  # seconds one remote wait for a child event lasts
CALL_POLL = 0.02  # seconds between looks at a cluster call running on its thread
CLOSE_TIMEOUT = 10.0  # seconds closing a session may wait on the cluster, all calls together


class RayUnavailable(OmniError):
    """The cluster cannot be reached, or cannot hold the plan (exit 1: the deploy file may be
    right). What the deploy file gets wrong is a ConfigError (exit 2)."""


def import_ray() -> Any:
    # Ray's native signal handler (read when ray is imported) turns the SIGTERM
    # that stops `omni serve` into an abort with a stack dump; omni handles
    # SIGTERM itself and stops cleanly.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError:
        raise ConfigError(
            'runtime.launcher = "ray" needs Ray, which is not installed',
            hint="pip install 'omni-core[ray]'",
        ) from None
    return ray


def cluster_address(config: Any) -> str | None:
    """Where to join: ``ray.address``, else ``$RAY_ADDRESS``; None for no cluster named."""
    return config.ray.address or os.environ.get("RAY_ADDRESS") or None


def connect(config: Any) -> bool:
    """Join (or start) the cluster; True when this call connected (and so must disconnect)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = cluster_address(config)
    if address is None and not config.ray.start_local:
        raise ConfigError(
            'runtime.launcher = "ray" names no cluster',
            hint="pass --ray-address HOST:PORT (or set RAY_ADDRESS), or set "
            "ray.start_local = true to start a one-node cluster",
        )
    if address is not None:
        probe(address, min(config.ray.connect_timeout, 10.0))
    try:
        with signal_handlers_kept():  # ray.init replaces them with a sys.exit
            ray.init(
                # "local" starts a cluster of our own even where another one runs on
                # this machine (a bare None would join that one).
                address=address or "local",
                namespace=config.ray.namespace,
                log_to_driver=False,
                include_dashboard=False if address is None else None,
                configure_logging=False,
            )
    except Exception as exc:  # ConnectionError, RuntimeError, ValueError, by version
        raise RayUnavailable(
            f"cannot join the Ray cluster at {address or '(a new local cluster)'}: {exc}",
            hint="start one with `ray start --head`, and pass its address with --ray-address",
        ) from None
    return True


def probe(address: str, timeout: float) -> None:
    """Fail in seconds, saying so, where ``ray.init`` would retry an unreachable address for
    minutes. Only ``HOST:PORT`` is probed (``ray://`` and ``auto`` are Ray's to resolve)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RayUnavailable(
            f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}",
            hint="is `ray start --head` running there? check the address and port "
            "(--ray-address, or $RAY_ADDRESS)",
        ) from None


def node_name(node: dict[str, Any]) -> str:
    labels = node.get("Labels") or {}
    return labels.get(NODE_LABEL) or f"node-{node['NodeID'][:8]}"


def live_inventory(ray: Any) -> GpuInventory:
    """The cluster's alive nodes, the driver's first, as a multi-node inventory."""
    here = ray.get_runtime_context().get_node_id()
    alive = [n for n in ray.nodes() if n.get("Alive")]
    alive.sort(key=lambda n: (n["NodeID"] != here, node_name(n)))
    nodes, devices = [], []
    for node in alive:
        resources = node.get("Resources", {})
        gpus = int(resources.get("GPU", 0))
        first = len(devices)
        devices += [GpuDevice(first + i) for i in range(gpus)]
        nodes.append(
            ClusterNode(
                node_name(node),
                gpus,
                first,
                resources.get("CPU"),
                node["NodeID"],
                node.get("NodeManagerAddress"),
            )
        )
    return GpuInventory(tuple(devices), True, None, "ray", (), tuple(nodes))


class RayLauncher(Launcher):
    name = "ray"
    description = "actors on a Ray cluster, one placement group (pip install omni-core[ray])"

    def inventory(self, config: Any) -> GpuInventory | None:
        """The connected cluster's nodes; None (plan offline) when no cluster is named."""
        if cluster_address(config) is None:
            return None
        ray = import_ray()
        owned = connect(config)
        try:
            return live_inventory(ray)
        finally:
            if owned:
                ray.shutdown()

    def session(self, plan: Any, config: Any) -> LaunchSession:
        return RaySession(plan, config)


class RaySession(LaunchSession):
    def __init__(self, plan: Any, config: Any):
        self.plan, self.config = plan, config
        self.addresses: dict[str, str] = {}
        self.ray: Any = None
        self.owned = False
        self.pg: Any = None
        self.bundle_of: dict[str, int] = {}
        self.share_of: dict[str, tuple[float, float]] = {}  # process -> (cpus, gpus)
        self.actors: dict[str, Any] = {}
        # The deployment's id, and a run's own token: two `omni serve` of one
        # deploy file on one cluster must not fight over actor names.
        self.prefix = f"omni-{plan.endpoints.deployment_id}-{secrets.token_hex(3)}"

    # -- open -----------------------------------------------------------------
    async def open(self) -> None:
        self.ray = import_ray()
        self.owned = connect(self.config)  # on the main thread: ray.init sets signal handlers
        try:
            await _cluster_call(self._place)
            await _cluster_call(self._reserve)
        except BaseException:
            await self.aclose()
            raise

    def _node_ids(self) -> dict[str, str]:
        """The plan's node names to live node ids; every planned node must be alive."""
        live = live_inventory(self.ray)
        ids = {node.name: node.node_id for node in live.nodes}
        if self.plan.nodes is None:  # planned for one host: all of it on the driver's node
            return {None: live.nodes[0].node_id}  # type: ignore[dict-item]
        missing = sorted({n.name for n in self.plan.nodes.nodes} - set(ids))
        if missing:
            raise ConfigError(
                f"the plan places processes on node{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)}, which the Ray cluster does not have (alive: "
                f"{', '.join(ids)})",
                hint=f"label the nodes with ray start --labels '{{\"{NODE_LABEL}\": NAME}}', "
                "or plan against the cluster itself (omni plan with --ray-address)",
            )
        return ids

    def _place(self) -> None:
        from ray.util import placement_group

        ids = self._node_ids()
        cpus = self.config.ray.cpus_per_process
        bundles: list[dict[str, float]] = []
        selectors: list[dict[str, str]] = []
        by_gpu: dict[tuple[str | None, int], int] = {}
        members: dict[int, list[str]] = {}
        for process in self.plan.processes:
            node = process.node if self.plan.nodes is not None else None
            key = (node, process.gpu) if process.gpu is not None else None
            if key is not None and key in by_gpu:
                index = by_gpu[key]
                bundles[index]["CPU"] += cpus
            else:
                index = len(bundles)
                bundle = {"CPU": cpus}
                if process.gpu is not None:
                    bundle["GPU"] = 1.0
                    by_gpu[key] = index  # type: ignore[index]
                bundles.append(bundle)
                selectors.append({NODE_ID_LABEL: ids[node]})  # type: ignore[index]
            self.bundle_of[process.name] = index
            members.setdefault(index, []).append(process.name)
        for index, names in members.items():
            gpus = bundles[index].get("GPU", 0.0)
            for name in names:
                self.share_of[name] = (cpus, gpus / len(names))
        strategy = self.config.ray.strategy.upper()
        self.pg = placement_group(
            bundles, strategy=strategy, name=self.prefix, bundle_label_selector=selectors
        )
        try:
            self.ray.get(self.pg.ready(), timeout=self.config.ray.connect_timeout)
        except Exception:
            raise RayUnavailable(
                f"the Ray cluster could not place the plan's {len(bundles)} bundles "
                f"({_describe(bundles)}) within {self.config.ray.connect_timeout:g} s",
                hint="check free resources with `ray status`; lower ray.cpus_per_process, "
                "or raise ray.connect_timeout",
            ) from None

    def _reserve(self) -> None:
        """Create every group's actor; each reserves its node's TCP port for the group."""
        for process in self.plan.processes:
            self.actors[process.name] = self._actor(process.name)
        hosts = self.ray.get([a.node_ip.remote() for a in self.actors.values()])
        ports = self.ray.get(
            [a.reserve.remote(h) for a, h in zip(self.actors.values(), hosts, strict=True)]
        )
        self.addresses = dict(zip(self.actors, ports, strict=True))
        self.addresses["coordinator"] = _reserve_here(self.ray.util.get_node_ip_address())

    def _actor(self, process: str) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .ray_actor import ProcessGroupActor

        cpus, gpus = self.share_of[process]
        remote = self.ray.remote(ProcessGroupActor)
        return remote.options(
            name=f"{self.prefix}-{process}",
            namespace=self.config.ray.namespace,
            num_cpus=cpus,
            num_gpus=gpus,
            max_restarts=0,
            max_concurrency=4,  # a blocking wait for events must not hold up a stop
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=self.bundle_of[process]
            ),
        ).remote(f"{self.prefix}-{process}", self.plan.endpoints.runtime_dir)

    # -- processes --------------------------------------------------------------
    def process(self, name: str, log_path: str) -> ProcessHandle:
        return RayProcess(self, name, log_path)

    def actor(self, name: str) -> Any:
        """The group's actor, a new one in the same bundle when the old one is gone."""
        actor = self.actors.get(name)
        if actor is not None:
            try:
                self.ray.get(actor.node_ip.remote(), timeout=10)
                return actor
            except Exception:
                self._kill(actor)
        actor = self.actors[name] = self._actor(name)
        return actor

    # -- close ----------------------------------------------------------------------
    async def aclose(self) -> None:
        """Kill the actors, remove the placement group, and stop a cluster of our own.

        Each cluster call is bounded (:data:`CLOSE_TIMEOUT` in all): a cluster whose head
        is gone holds nothing any more, but Ray's client would retry its lost
        GCS for minutes, and an operator stopping omni waits for none of that.
        """
        if self.ray is None:
            return
        deadline = time.monotonic() + CLOSE_TIMEOUT
        steps = [
            (f"killing actor {self.prefix}-{name}", partial(self.ray.kill, actor, no_restart=True))
            for name, actor in self.actors.items()
        ]
        if self.pg is not None:
            from ray.util import remove_placement_group

            removing = partial(remove_placement_group, self.pg)
            steps.append((f"removing placement group {self.prefix}", removing))
        owned, self.owned = self.owned, False
        self.actors.clear()
        self.pg = None
        for what, step in steps:
            if not await _finished_within(deadline - time.monotonic(), step):
                print(
                    f"omni: ray: no answer from the cluster within {CLOSE_TIMEOUT:g} s while "
                    f"{what}; leaving the rest to it (a cluster that is gone holds nothing)",
                    file=sys.stderr,
                    flush=True,
                )
                return
        if owned and self.ray.is_initialized():  # ours, and it answered: its processes go too
            self.ray.shutdown()

    def _kill(self, actor: Any) -> None:
        with contextlib.suppress(Exception):  # already dead
            self.ray.kill(actor, no_restart=True)


async def _cluster_call(call: Callable[[], T]) -> T:
    """``call()``, which blocks on the cluster, run on a daemon thread; cancellable.

    Not ``anyio.to_thread``: its threads cannot be abandoned at exit, and a
    cancelled wait would still wait for the thread. With the cluster's head
    gone, Ray retries a call for minutes, and an ``omni serve`` stopped in the
    middle of restarting a process group must stop now, not then.
    """
    done = threading.Event()
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the waiting task
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="omni-ray-call", daemon=True).start()
    while not done.is_set():
        await anyio.sleep(CALL_POLL)
    finished, value = outcome[0]
    if not finished:
        raise value
    return value


async def _finished_within(seconds: float, call: Callable[[], Any]) -> bool:
    """Run a blocking cluster call on a daemon thread; False if it is still running after
    ``seconds`` (it is left to finish or fail on its own). Its errors count as finished:
    an actor already dead, a group already removed."""
    done = threading.Event()

    def run() -> None:
        with contextlib.suppress(Exception):
            call()
        done.set()

    threading.Thread(target=run, name="omni-ray-close", daemon=True).start()
    return await anyio.to_thread.run_sync(done.wait, max(seconds, 0.0))


def _reserve_here(host: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        return f"tcp://{host}:{sock.getsockname()[1]}"


def _describe(bundles: list[dict[str, float]]) -> str:
    gpu = sum(1 for b in bundles if b.get("GPU"))
    cpu = sum(b["CPU"] for b in bundles)
    return f"{gpu} GPU{'s' if gpu != 1 else ''}, {cpu:g} CPUs"


class RayProcess(ProcessHandle):
    """A process group's child, as seen through its actor.

    A thread waits on the actor for the child's events (so nothing here blocks
    the event loop): ready and failed messages queue up for ``recv``; the
    child's exit, or the actor's death, sets ``exitcode``.
    """

    def __init__(self, session: RaySession, name: str, log_path: str):
        self.session, self.name, self.log_path = session, name, log_path
        self.actor: Any = None
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._exitcode: int | None = None
        self._started = False
        self._tail: str | None = None
        self._where: dict[str, Any] = {}
        self._watcher: threading.Thread | None = None

    async def start(self, spec: Any) -> None:
        # Cluster calls block (placing a new actor takes seconds): off the loop.
        # The child is forked by the actor, on its node, not here.
        await _cluster_call(partial(self._start, spec))

    def _start(self, spec: Any) -> None:
        self.actor = self.session.actor(self.name)
        ray = self.session.ray
        ray.get(self.actor.start.remote(spec), timeout=60)
        self._where = ray.get(self.actor.where.remote(), timeout=10)
        self._started = True
        self._watcher = threading.Thread(target=self._watch, name=f"omni-ray:{self.name}")
        self._watcher.daemon = True
        self._watcher.start()

    def _watch(self) -> None:
        ray = self.session.ray
        while True:
            try:
                event = ray.get(self.actor.next_event.remote(EVENT_WAIT))
            except Exception as exc:  # the actor died (RayActorError) or Ray went away
                self._tail = f"(actor {self.session.prefix}-{self.name} is gone: {exc})"
                self._exitcode = -9
                return
            if event is None:
                continue
            if event[0] == "exited":
                self._tail = event[2]
                code = event[1]
                self._exitcode = code if code is not None else -9
                return
            self.events.put((event[0], event[1]))

    def poll(self) -> bool:
        return not self.events.empty()

    def recv(self) -> tuple[str, Any]:
        try:
            return self.events.get_nowait()
        except queue.Empty:
            raise EOFError from None

    def is_alive(self) -> bool:
        return self._started and self._exitcode is None

    @property
    def exitcode(self) -> int | None:
        return self._exitcode

    @property
    def pid(self) -> int | None:
        return self._where.get("pid")

    def terminate(self) -> None:
        if self.actor is not None:
            self.actor.signal.remote(int(signal.SIGTERM))

    def kill(self) -> None:
        if self.actor is not None:
            self.actor.signal.remote(int(signal.SIGKILL))

    def join(self, timeout: float | None = None) -> None:
        if self._watcher is not None:
            self._watcher.join(timeout)

    def where(self) -> dict[str, Any]:
        return {k: v for k, v in self._where.items() if k != "pid"}

    def log_tail(self, lines: int = 20) -> str | None:
        if self._tail is not None:
            return self._tail
        if self.actor is None:
            return None
        try:
            return self.session.ray.get(self.actor.log_tail.remote(lines), timeout=5)
        except Exception:
            return None
