"""Transport throughput and per-hop latency between two Ray nodes, beside the same-host figures.

Run: ``.venv/bin/python benchmarks/bench_ray_transport.py [--runs N]`` (about two
minutes on 2 cores, a few GB of RAM and of /dev/shm; ``--smoke``: 1 MB messages,
short bursts, a few pings, to check that the script still runs).

Same host (measured first, with no Ray cluster running): the ``shm`` and
``socket`` (Unix socket) rows are ``bench_transport._measure``'s figures (a
sender process bursts 1 MB, 16 MB and 256 MB float32 tensors to a spawned
receiver; see that file), and their per-hop latency is half the median round
trip of a small message (a dict holding a 1 KB tensor) to a spawned process
that echoes it.

Across nodes: a two-node Ray cluster on this machine (``ray.cluster_utils``:
nodes labelled ``omni-node = a`` and ``b``, each with its own raylet and object
store). A sender actor pinned to node a and a receiver actor pinned to node b:

* ``tcp``: the project's TCP transport (authenticated, tensors sent raw). The
  receiver listens at ``tcp://<node ip>:0``; a burst of N tensors goes to it,
  it reads one element of each and acknowledges the burst on a second TCP
  channel; the clock runs from the first send to the acknowledgement. Per hop:
  half the median round trip of the small message, echoed back.
* object store: per message the sender ``ray.put``s the tensor and calls the
  receiver with the reference (inside a list, so the receiver's own
  ``ray.get`` does the fetch); the receiver reads one element and returns.
  The clock runs from the first put until the last call has returned, so it
  includes the puts and one actor call per message (how a receiver would learn
  of a reference). Two ways of putting: the tensor itself (Ray pickles it)
  and ``tensor.numpy()`` (stored as a raw buffer; ``ray.get`` on the receiver
  is a zero-copy, read-only view of its node's store). Per hop: the median
  time from before the put until the receiver's ``ray.get`` returned, read on
  the host's monotonic clock (one clock for both actors because both nodes run
  on this machine).

A warm-up burst precedes each timed one; with ``--runs N`` each figure is the
best of N bursts (latency: the median of N x 200 round trips). The last line
says, per measured payload size, whether TCP or the object store (its better
way of putting) moved tensors faster: the choice issue 16 asks for.

Caveats: the "cross-node" traffic is loopback. Ray's object store still moves
an object between the two raylets' stores through its object manager (chunked
pushes over gRPC), which is what a transfer between hosts does; but no NIC
bounds either figure here (10 GbE would cap both near 1.25 GB/s), so the
ratio between TCP and the object store, and the latencies' order, carry over
better than the absolute numbers. Sender, receiver, both raylets and the GCS
share 2 cores, and the machine may be shared: take the figures as lower
bounds. ``OMP_NUM_THREADS`` is 1 in every process.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from omni_core.sigterm import run_script

if TYPE_CHECKING:
    from omni_core.transport import Channel, Transport

SIZES_MB = (1, 16, 256)
BURST_BYTES = 1 << 30  # per cross-node burst; the same-host rows use bench_transport's 2 GB
PINGS = 200  # round trips per latency figure (per run)
WARMUP_PINGS = 20
PING_FLOATS = 256  # the small message's tensor: 1 KB of float32
STORE_BYTES = 2 << 30  # each node's object store: a 1 GB burst plus slack
TIMEOUT_S = 300.0  # for any one Ray call; a hung transport fails instead of stalling


def _count(size_mb: int) -> int:
    return max(4, min(200, BURST_BYTES // (size_mb << 20)))


def _smoke() -> None:
    """Tiny sizes (``--smoke``): the code runs, the figures mean little.

    Ray pickles the actors of this script by value, globals included, so the
    actors see these values; the same-host rows' ``bench_transport`` is shrunk too.
    """
    global SIZES_MB, BURST_BYTES, PINGS, WARMUP_PINGS, STORE_BYTES
    SIZES_MB, BURST_BYTES, PINGS, WARMUP_PINGS, STORE_BYTES = (1,), 4 << 20, 10, 2, 256 << 20
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_transport

    bench_transport._smoke()


def _transport(name: str) -> Transport:
    from omni_core.plugins import OmniPlugins

    return OmniPlugins(env={}).transport(name)


def _small_message(seq: int, as_numpy: bool = False) -> dict[str, Any]:
    import torch

    payload = torch.ones(PING_FLOATS)
    return {"seq": seq, "payload": payload.numpy() if as_numpy else payload}


# -- ping-pong and bursts over a pair of channels (same host and TCP alike) ----


async def _ping(outbox: Channel, inbox: Channel, count: int) -> float:
    """Half the median round trip of a small message, in microseconds."""
    samples: list[int] = []
    for seq in range(WARMUP_PINGS + count):
        message = _small_message(seq)
        start = time.perf_counter_ns()
        await outbox.send(message)
        reply = await inbox.recv()
        elapsed = time.perf_counter_ns() - start
        assert reply["seq"] == seq, reply
        if seq >= WARMUP_PINGS:
            samples.append(elapsed)
    return statistics.median(samples) / 2 / 1e3


async def _echo(inbox: Channel, outbox: Channel, count: int) -> None:
    for _ in range(WARMUP_PINGS + count):
        await outbox.send(await inbox.recv())


async def _send_bursts(outbox: Channel, acks: Channel, runs: int) -> dict[int, float]:
    """GB/s per size: the best of ``runs`` timed bursts, each acknowledged by the receiver."""
    import torch

    best: dict[int, float] = {}
    for size_mb in SIZES_MB:
        tensor = torch.randn((size_mb << 20) // 4)
        count = _count(size_mb)
        for burst in range(1 + runs):  # the first is the warm-up
            start = time.perf_counter()
            for _ in range(count):
                await outbox.send(tensor)
            assert await acks.recv() == size_mb
            rate = count * tensor.nbytes / (time.perf_counter() - start) / 1e9
            if burst:
                best[size_mb] = max(best.get(size_mb, 0.0), rate)
        del tensor
    return best


async def _receive_bursts(inbox: Channel, acks: Channel, runs: int) -> None:
    for size_mb in SIZES_MB:
        for _ in range(1 + runs):
            for _ in range(_count(size_mb)):
                tensor = await inbox.recv()
                float(tensor[-1])
                del tensor
            await acks.send(size_mb)


# -- same host: two local processes ------------------------------------------


def _echo_child(
    name: str, inbox: str, outbox: str, count: int, secret: bytes, ready: Any, warmup: int
) -> None:
    global WARMUP_PINGS
    WARMUP_PINGS = warmup  # a spawned child starts from the module's default
    import anyio
    import torch

    torch.set_num_threads(1)
    transport = _transport(name)

    async def main() -> None:
        async with (
            transport.listen(inbox, secret=secret) as receiving,
            transport.connect(outbox, secret=secret) as sending,
        ):
            ready.set()
            await _echo(receiving, sending, count)

    anyio.run(main)


def _same_host_latency(name: str, count: int, secret: bytes) -> float:
    import anyio

    transport = _transport(name)
    with tempfile.TemporaryDirectory(prefix="omni-bench-") as workdir:
        forth, back = f"unix:{workdir}/{name}.ping", f"unix:{workdir}/{name}.pong"
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        proc = ctx.Process(
            target=_echo_child,
            args=(name, forth, back, count, secret, ready, WARMUP_PINGS),
            daemon=True,
        )
        proc.start()
        try:
            deadline = time.monotonic() + 60
            while not ready.wait(0.2):
                if not proc.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the {name} echo process did not start")

            async def main() -> float:
                async with (
                    transport.listen(back, secret=secret) as inbox,
                    transport.connect(forth, secret=secret) as outbox,
                ):
                    return await _ping(outbox, inbox, count)

            return anyio.run(main)
        finally:
            proc.join(30)
            if proc.is_alive():
                proc.kill()


def _same_host(runs: int, secret: bytes) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_transport import _measure

    throughput: dict[str, dict[int, float]] = {}
    latency: dict[str, float] = {}
    for label, name in (("same-host shm", "shm"), ("same-host socket (unix)", "socket")):
        bursts = [_measure(name, read=False) for _ in range(runs)]
        throughput[label] = {mb: max(b[mb] for b in bursts) for mb in SIZES_MB}
        latency[label] = _same_host_latency(name, PINGS * runs, secret)
    return throughput, latency


# -- across nodes: two Ray actors on two raylets ------------------------------


class Peer:
    """One end, as a Ray actor: a TCP receiver bound at once, and both roles' methods."""

    def __init__(self, secret: bytes) -> None:
        import ray
        import torch

        torch.set_num_threads(1)
        self.secret = secret
        self.tcp = _transport("tcp")
        self.inbox = self.tcp.listen(f"tcp://{ray.util.get_node_ip_address()}:0", secret=secret)

    def address(self) -> str:
        return self.inbox.address

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def tcp_receive(self, peer: str, runs: int) -> None:
        import anyio

        async def main() -> None:
            async with self.inbox, self.tcp.connect(peer, secret=self.secret) as outbox:
                await _receive_bursts(self.inbox, outbox, runs)
                await _echo(self.inbox, outbox, PINGS * runs)

        anyio.run(main)

    def tcp_send(self, peer: str, runs: int) -> tuple[dict[int, float], float]:
        import anyio

        async def main() -> tuple[dict[int, float], float]:
            async with self.inbox, self.tcp.connect(peer, secret=self.secret) as outbox:
                rates = await _send_bursts(outbox, self.inbox, runs)
                return rates, await _ping(outbox, self.inbox, PINGS * runs)

        return anyio.run(main)

    def fetch(self, box: list[Any]) -> float:
        """Get the object behind ``box[0]``, read one element; the monotonic clock after."""
        import ray

        value = ray.get(box[0])
        tensor = value["payload"] if isinstance(value, dict) else value
        float(tensor[-1])
        del value, tensor
        return time.clock_gettime(time.CLOCK_MONOTONIC)

    def store_send(self, sink: Any, runs: int, as_numpy: bool) -> tuple[dict[int, float], float]:
        import ray
        import torch

        best: dict[int, float] = {}
        for size_mb in SIZES_MB:
            tensor = torch.randn((size_mb << 20) // 4)
            obj = tensor.numpy() if as_numpy else tensor
            count = _count(size_mb)
            for burst in range(1 + runs):  # the first is the warm-up
                start = time.perf_counter()
                refs: list[Any] = []
                calls: list[Any] = []
                for _ in range(count):
                    refs.append(ray.put(obj))
                    calls.append(sink.fetch.remote([refs[-1]]))
                ray.get(calls, timeout=TIMEOUT_S)
                rate = count * tensor.nbytes / (time.perf_counter() - start) / 1e9
                del refs, calls
                if burst:
                    best[size_mb] = max(best.get(size_mb, 0.0), rate)
            del tensor, obj
        return best, self._store_latency(sink, PINGS * runs, as_numpy)

    def _store_latency(self, sink: Any, count: int, as_numpy: bool) -> float:
        """Median microseconds from before a small put until the remote get returned."""
        import ray

        samples: list[float] = []
        for seq in range(WARMUP_PINGS + count):
            message = _small_message(seq, as_numpy)
            start = time.clock_gettime(time.CLOCK_MONOTONIC)
            ref = ray.put(message)
            got = ray.get(sink.fetch.remote([ref]), timeout=TIMEOUT_S)
            if seq >= WARMUP_PINGS:
                samples.append(got - start)
            del ref
        return statistics.median(samples) * 1e6


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _two_nodes() -> Iterator[dict[str, str]]:
    """A two-node Ray cluster on this machine; yields node ids by ``omni-node`` label."""
    import ray

    from omni_core.harness import local_ray_cluster

    head = {
        "num_cpus": 2,
        "labels": {"omni-node": "a"},
        "include_dashboard": False,
        # Ray starts a minimal dashboard anyway; 8265 may be another cluster's.
        "dashboard_port": _free_port(),
        "object_store_memory": STORE_BYTES,
    }
    worker = {"num_cpus": 2, "labels": {"omni-node": "b"}, "object_store_memory": STORE_BYTES}
    with local_ray_cluster(head, worker) as cluster:
        try:
            ray.init(address=cluster.address, log_to_driver=False)
            nodes = {
                (n.get("Labels") or {}).get("omni-node", ""): n["NodeID"]
                for n in ray.nodes()
                if n["Alive"]
            }
            yield {label: nodes[label] for label in ("a", "b")}
        finally:
            ray.shutdown()


def _cross_node(runs: int, secret: bytes) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    throughput: dict[str, dict[int, float]] = {}
    latency: dict[str, float] = {}
    with _two_nodes() as nodes:
        actor = ray.remote(Peer)

        def place(label: str) -> Any:
            strategy = NodeAffinitySchedulingStrategy(nodes[label], soft=False)
            return actor.options(num_cpus=1, scheduling_strategy=strategy).remote(secret)

        sender, receiver = place("a"), place("b")
        where = ray.get([sender.node_id.remote(), receiver.node_id.remote()], timeout=TIMEOUT_S)
        assert where == [nodes["a"], nodes["b"]], (where, nodes)
        to_sender, to_receiver = ray.get(
            [sender.address.remote(), receiver.address.remote()], timeout=TIMEOUT_S
        )
        done = receiver.tcp_receive.remote(to_sender, runs)
        rates, hop = ray.get(sender.tcp_send.remote(to_receiver, runs), timeout=TIMEOUT_S)
        ray.get(done, timeout=TIMEOUT_S)
        throughput["cross-node tcp"], latency["cross-node tcp"] = rates, hop
        for label, as_numpy in (
            ("cross-node store put(tensor)", False),
            ("cross-node store put(numpy)", True),
        ):
            call = sender.store_send.remote(receiver, runs, as_numpy)
            throughput[label], latency[label] = ray.get(call, timeout=TIMEOUT_S)
    return throughput, latency


# -- report --------------------------------------------------------------------


def _table(throughput: dict[str, dict[int, float]], latency: dict[str, float]) -> None:
    print(f"{'GB/s':30}" + "".join(f"{f'{mb} MB':>10}" for mb in SIZES_MB) + f"{'hop us':>10}")
    for label, rates in throughput.items():
        cells = "".join(f"{rates[mb]:10.2f}" for mb in SIZES_MB)
        print(f"{label:30}{cells}{latency[label]:10.0f}")


def _choice(throughput: dict[str, dict[int, float]], latency: dict[str, float]) -> str:
    """Per measured size, TCP or the object store's better way of putting, from the figures."""
    tcp = throughput["cross-node tcp"]
    stores = {label: rates for label, rates in throughput.items() if "store" in label}
    parts = []
    for mb in SIZES_MB:
        store_label = max(stores, key=lambda label: stores[label][mb])
        store = stores[store_label][mb]
        winner = "tcp" if tcp[mb] >= store else store_label.removeprefix("cross-node ")
        parts.append(f"{mb} MB -> {winner} ({tcp[mb]:.2f} vs {store:.2f} GB/s)")
    hop_store = min(latency[label] for label in stores)
    hop_tcp = latency["cross-node tcp"]
    hop = "tcp" if hop_tcp <= hop_store else "object store"
    return (
        "choose per payload size (tcp vs the better object-store put): "
        + "; ".join(parts)
        + f"; per hop -> {hop} ({hop_tcp:.0f} vs {hop_store:.0f} us)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="timed bursts per figure (best kept)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one repeat: checks the script runs (make test)",
    )
    args = parser.parse_args()
    if args.smoke:
        _smoke()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    # One thread per process (inherited by the spawned receivers and by Ray's
    # raylets and workers): with 2 shared cores a thread pool stalls on itself.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] = "1"
    import torch

    torch.set_num_threads(1)
    secret = secrets.token_bytes(32)  # the deployment secret both ends authenticate with
    began = time.perf_counter()
    throughput, latency = _same_host(args.runs, secret)
    cross_rates, cross_hops = _cross_node(args.runs, secret)
    throughput.update(cross_rates)
    latency.update(cross_hops)
    _table(throughput, latency)
    print(_choice(throughput, latency))
    print(
        "notes: both Ray nodes run on this machine, so cross-node traffic is loopback; Ray's "
        "object store still moves each object between the two raylets' stores through its "
        "object manager, as a transfer between hosts does. Store throughput includes the put "
        "and one actor call per message; tcp and same-host hops are half a 1 KB round trip, "
        "store hops are put to remote get on the shared monotonic clock."
    )
    print(f"total {time.perf_counter() - began:.1f} s on {os.cpu_count()} CPUs, runs={args.runs}")


if __name__ == "__main__":
    run_script(main)
