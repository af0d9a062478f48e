"""The built-in transports: inproc, shm and socket.

Cross-process tests use multiprocessing with the spawn start method, with the
child ends in :mod:`transport_peers`. Leak checks look where a leak would be:
/dev/shm entries with our prefix, memfd descriptors and mappings held by the
processes involved (/proc/PID/fd and /proc/PID/maps), and the host's shared
memory total (/proc/meminfo "Shmem"), which drops only when the kernel has
really freed the pages.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import torch

from omni_core.runtime.transports import (
    BUILTIN_TRANSPORTS,
    InprocTransport,
    ShmTransport,
    SocketTransport,
)
from omni_core.transport import AddressError, ChannelClosed, Transport

sys.path.insert(0, str(Path(__file__).parent))
import transport_peers as peers
from transport_peers import SECRET

pytestmark = pytest.mark.anyio
LINUX = sys.platform.startswith("linux")
SPAWN = mp.get_context("spawn")
MB = 1 << 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def tmp_sock_dir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the 107-byte limit of a socket path.
    with tempfile.TemporaryDirectory(prefix="omni-t-") as name:
        yield Path(name)


def nested_message() -> dict[str, Any]:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "f32": base,
        "f16": base.to(torch.float16),
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "i64": torch.arange(-5, 5),
        "bool": torch.tensor([True, False, True]),
        "u8": torch.arange(256, dtype=torch.uint8),
        "c64": torch.randn(4, dtype=torch.complex64),
        "transposed": base.t(),
        "strided": torch.arange(100.0)[::3],
        "bf16_noncontig": torch.randn(8, 8).to(torch.bfloat16)[:, 1::2],
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 7),
        "big": torch.randn(300_000),  # above the shm threshold
        "np": np.arange(12, dtype=np.float64).reshape(3, 4),
        "np_noncontig": np.arange(40, dtype=np.int32).reshape(5, 8)[:, ::2],
        "np_big": np.ones((512, 512), dtype=np.float32),
        "np_struct": np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
        "bytes_small": b"abc",
        "bytes_big": os.urandom(100_000),
        "bytearray": bytearray(os.urandom(5000)),
        "memoryview": memoryview(os.urandom(3000)),
        "list": [1, 2.5, "three", None, [torch.ones(2)], (np.zeros(3), b"x" * 2000)],
        "tuple": (peers.Point(1, "p"), {"deep": {"deeper": torch.zeros(2, 2, dtype=torch.int8)}}),
        "set": {1, 2, 3},
    }


def assert_same(got: Any, want: Any, path: str = "message") -> None:
    """Equal values of the same kind; tensors and arrays compared exactly."""
    if isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor, path
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert torch.equal(got, want), path
    elif isinstance(want, np.ndarray):
        assert type(got) is np.ndarray, path
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert np.array_equal(got, want), path
    elif isinstance(want, memoryview):
        assert isinstance(got, memoryview), path
        assert got.tobytes() == want.tobytes(), path
    elif isinstance(want, dict):
        assert type(got) is type(want) and got.keys() == want.keys(), path
        for key in want:
            assert_same(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, list | tuple):
        assert type(got) is type(want) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert type(got) is type(want) and got == want, path


def addresses(name: str, sock_dir: Path) -> str:
    return {
        "inproc": "inproc://edge",
        "shm": f"unix:{sock_dir}/edge.sock",
        "socket-unix": f"unix:{sock_dir}/edge.sock",
        "socket-tcp": "tcp://127.0.0.1:0",
        "shm-abstract": f"unix:@omni-test-{os.getpid()}",
    }[name]


def make(name: str) -> Transport:
    if name == "inproc":
        return InprocTransport()
    if name.startswith("shm"):
        return ShmTransport()
    return SocketTransport()


LOCAL = ["inproc", "shm", "shm-abstract", "socket-unix", "socket-tcp"]


def omni_dev_shm() -> list[str]:
    return sorted(e for e in os.listdir("/dev/shm") if "omni" in e) if LINUX else []


def shmem_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem in /proc/meminfo")


# -- the plugin face ----------------------------------------------------------


def test_builtins_are_registered_with_names_and_scopes() -> None:
    by_name = {cls().name: cls() for cls in BUILTIN_TRANSPORTS}
    assert set(by_name) == {"inproc", "shm", "socket"}
    assert by_name["inproc"].scopes == {"process"}
    assert by_name["shm"].scopes == {"host"}
    assert by_name["socket"].scopes == {"host", "network"}


def test_importing_transports_does_not_import_torch() -> None:
    code = (
        "import sys, anyio\n"
        "from omni_core.runtime.transports import SocketTransport, ShmTransport\n"
        "SECRET = b'k' * 32\n"
        "async def main():\n"
        "    t = ShmTransport()\n"
        "    async with t.listen('unix:@omni-notorch-%d' % id(t), secret=SECRET) as rx:\n"
        "        tx = t.connect(rx.address, secret=SECRET)\n"
        "        await tx.send({'b': b'x' * 200000, 'n': [1, 2]})\n"
        "        assert (await rx.recv())['b'] == b'x' * 200000\n"
        "        await tx.aclose()\n"
        "anyio.run(main)\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- addresses ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("transport", "address", "words"),
    [
        (SocketTransport(), "", "empty address"),
        (SocketTransport(), "localhost:5555", "cannot read address"),
        (SocketTransport(), "tcp://127.0.0.1", "tcp://HOST:PORT"),
        (SocketTransport(), "tcp://127.0.0.1:99999", "PORT 0-65535"),
        (SocketTransport(), "tcp://:80", "tcp://HOST:PORT"),
        (SocketTransport(), "unix:", "names no socket path"),
        (SocketTransport(), "unix:/" + "x" * 200, "the system allows"),
        (ShmTransport(), "tcp://127.0.0.1:5555", "one host only"),
        (ShmTransport(), "/tmp/no-scheme.sock", "cannot read address"),
        (InprocTransport(), "", "not a usable name"),
        (InprocTransport(), "inproc://", "not a usable name"),
    ],
)
def test_malformed_address_is_refused_clearly(
    transport: Transport, address: str, words: str
) -> None:
    for attempt in (
        transport.check_address,
        functools.partial(transport.listen, secret=SECRET),
        functools.partial(transport.connect, secret=SECRET),
    ):
        with pytest.raises(AddressError) as caught:
            attempt(address)
        assert words in str(caught.value)
        assert transport.name in str(caught.value)


async def test_second_receiver_at_one_address_is_refused(tmp_sock_dir: Path) -> None:
    for name in ("inproc", "shm", "socket-unix"):
        transport, address = make(name), addresses(name, tmp_sock_dir)
        async with transport.listen(address, secret=SECRET):
            with pytest.raises(AddressError, match="already listens"):
                transport.listen(address, secret=SECRET)


async def test_stale_socket_file_is_reclaimed(tmp_sock_dir: Path) -> None:
    path = tmp_sock_dir / "stale.sock"
    import socket

    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: what a SIGKILLed receiver leaves
    async with ShmTransport().listen(f"unix:{path}", secret=SECRET) as rx:
        tx = ShmTransport().connect(rx.address, secret=SECRET)
        await tx.send("hello")
        assert await rx.recv() == "hello"
        await tx.aclose()
    assert not path.exists()


async def test_tcp_port_zero_reports_the_bound_port() -> None:
    async with SocketTransport().listen("tcp://127.0.0.1:0", secret=SECRET) as rx:
        assert rx.address.startswith("tcp://127.0.0.1:")
        assert not rx.address.endswith(":0")


# -- one process ----------------------------------------------------------------


@pytest.mark.parametrize("name", LOCAL)
async def test_nested_message_round_trip(name: str, tmp_sock_dir: Path) -> None:
    transport = make(name)
    message = nested_message()
    rx = transport.listen(addresses(name, tmp_sock_dir), secret=SECRET)
    async with rx, transport.connect(rx.address, secret=SECRET) as tx:
        await tx.send(message)
        got = await rx.recv()
    assert_same(got, message)
    if name == "inproc":
        assert got is message  # same process: the object itself


@pytest.mark.parametrize("name", LOCAL)
async def test_order_is_preserved(name: str, tmp_sock_dir: Path) -> None:
    transport = make(name)
    rx = transport.listen(addresses(name, tmp_sock_dir), secret=SECRET)
    async with (
        rx,
        transport.connect(rx.address, secret=SECRET) as tx,
        anyio.create_task_group() as group,
    ):

        async def produce() -> None:
            for i in range(300):
                payload = torch.full((i % 7 * 40_000,), i) if i % 3 else i
                await tx.send((i, payload))

        group.start_soon(produce)
        for i in range(300):
            seq, payload = await rx.recv()
            assert seq == i
            if i % 3:
                assert payload.numel() == i % 7 * 40_000
                assert bool((payload == i).all())


@pytest.mark.parametrize("name", ["inproc", "shm", "socket-unix"])
async def test_sender_may_start_before_receiver(name: str, tmp_sock_dir: Path) -> None:
    transport = make(name)
    address = addresses(name, tmp_sock_dir)
    tx = transport.connect(address, secret=SECRET)
    async with anyio.create_task_group() as group:
        group.start_soon(tx.send, "early")
        await anyio.sleep(0.05)  # let the sender find no receiver yet
        async with transport.listen(address, secret=SECRET) as rx:
            assert await rx.recv() == "early"
    await tx.aclose()


@pytest.mark.parametrize("name", ["inproc", "shm", "socket-unix"])
async def test_cancelled_recv_loses_nothing(name: str, tmp_sock_dir: Path) -> None:
    transport = make(name)
    async with transport.listen(addresses(name, tmp_sock_dir), secret=SECRET) as rx:
        with anyio.move_on_after(0.05):
            await rx.recv()  # nothing comes: cancelled while waiting
        async with transport.connect(rx.address, secret=SECRET) as tx:
            big = torch.randn(8 * MB)  # 32 MB: several reads, cancellation may hit mid-frame
            async with anyio.create_task_group() as group:
                group.start_soon(tx.send, big)
                group.start_soon(tx.send, "after")
                got = None
                while got is None:
                    with anyio.move_on_after(0.001):
                        got = await rx.recv()
                assert torch.equal(got, big)
                assert await rx.recv() == "after"


@pytest.mark.parametrize("name", ["inproc", "shm", "socket-unix"])
async def test_closed_channels_say_so(name: str, tmp_sock_dir: Path) -> None:
    transport = make(name)
    rx = transport.listen(addresses(name, tmp_sock_dir), secret=SECRET)
    tx = transport.connect(rx.address, secret=SECRET)
    await tx.send(1)
    assert await rx.recv() == 1
    await rx.aclose()
    with pytest.raises(ChannelClosed):
        await rx.recv()
    await tx.aclose()
    with pytest.raises(ChannelClosed):
        await tx.send(2)


async def test_socket_sender_without_receiver_times_out(tmp_sock_dir: Path) -> None:
    from omni_core.runtime.transports._stream import StreamSender

    address = SocketTransport().check_address(f"unix:{tmp_sock_dir}/nobody.sock")
    from omni_core.runtime.transports._address import parse

    tx = StreamSender(
        parse(address, transport="socket"),
        transport="socket",
        shm_min=None,
        secret=SECRET,
        connect_timeout=0.2,
    )
    with pytest.raises(ChannelClosed, match="no receiver"):
        await tx.send("lost")


async def test_receiver_closed_in_process_releases_shared_memory(tmp_sock_dir: Path) -> None:
    transport = ShmTransport()
    rx = transport.listen(f"unix:{tmp_sock_dir}/a.sock", secret=SECRET)
    tx = transport.connect(rx.address, secret=SECRET)
    for _ in range(4):
        await tx.send(torch.ones(4 * MB))
    assert peers.memfds(os.getpid()) > 0
    await rx.aclose()  # four messages never received
    with pytest.raises(ChannelClosed):
        await tx.send(torch.ones(4 * MB))  # the sender learns the receiver is gone
    await tx.aclose()
    assert peers.memfds(os.getpid()) == 0


async def test_received_tensors_outlive_the_channel(tmp_sock_dir: Path) -> None:
    transport = ShmTransport()
    rx = transport.listen(f"unix:{tmp_sock_dir}/a.sock", secret=SECRET)
    async with rx, transport.connect(rx.address, secret=SECRET) as tx:
        await tx.send({"t": torch.arange(1_000_000)})
        got = await rx.recv()
    assert int(got["t"][-1]) == 999_999  # its segment stays mapped while it lives
    del got
    assert peers.memfds(os.getpid()) == 0


# -- two processes ----------------------------------------------------------------


def _join(process: Any) -> None:
    process.join(60)
    if process.is_alive():
        process.kill()
        raise AssertionError("child did not finish")
    assert process.exitcode == 0


# TCP across processes is make test-all's: the in-process cases above run TCP in make test
@pytest.mark.parametrize(
    "name", ["shm", "socket-unix", pytest.param("socket-tcp", marks=pytest.mark.slow)]
)
async def test_cross_process_round_trip_and_large_payload(name: str, tmp_sock_dir: Path) -> None:
    before = omni_dev_shm()
    transport = make(name)
    kind = "shm" if name == "shm" else "socket"
    if name == "socket-tcp":
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        inbox, outbox = f"tcp://127.0.0.1:{port}", "tcp://127.0.0.1:0"
    else:
        inbox, outbox = f"unix:{tmp_sock_dir}/in.sock", f"unix:{tmp_sock_dir}/out.sock"
    large = torch.randint(0, 1 << 30, (16 * MB,), dtype=torch.int32)  # 64 MB
    messages = [nested_message(), {"large": large}, "done"]
    async with transport.listen(outbox, secret=SECRET) as replies:
        child = SPAWN.Process(target=peers.echo, args=(kind, inbox, replies.address, len(messages)))
        child.start()
        try:
            async with transport.connect(inbox, secret=SECRET) as tx:
                for message in messages:
                    await tx.send(message)
                echoed = [await replies.recv() for _ in messages]
        finally:
            await anyio.to_thread.run_sync(_join, child)
    assert_same(echoed[0], messages[0])
    assert torch.equal(echoed[1]["large"], large)
    assert echoed[2] == "done"
    del echoed
    assert peers.memfds(os.getpid()) == 0
    assert omni_dev_shm() == before


@pytest.mark.skipif(not LINUX, reason="reads /proc")
async def test_receiver_closed_with_messages_in_flight_leaks_nothing(
    tmp_sock_dir: Path,
) -> None:
    baseline = shmem_bytes()
    before = omni_dev_shm()
    sent, go_on = SPAWN.Queue(), SPAWN.Event()
    rx = ShmTransport().listen(f"unix:{tmp_sock_dir}/a.sock", secret=SECRET)
    child = SPAWN.Process(target=peers.flood, args=("shm", rx.address, 32 * MB, 8, sent, go_on))
    child.start()
    try:
        first = await rx.recv()
        assert first["seq"] == 0 and float(first["data"][0]) == 7.0
        del first
        for _ in range(8):
            await anyio.to_thread.run_sync(sent.get, True, 60)
        peak = shmem_bytes()
        assert peak - baseline > 150 * MB  # seven 32 MB messages wait, in shared memory
        await rx.aclose()  # ... and are never received
        assert peers.memfds(os.getpid()) == 0
        go_on.set()
        outcome = await anyio.to_thread.run_sync(sent.get, True, 60)
        assert outcome == "ChannelClosed"
        child_holds = await anyio.to_thread.run_sync(sent.get, True, 60)
        assert child_holds == 0  # the sender dropped its pool on seeing the receiver gone
        assert shmem_bytes() < peak - 150 * MB
    finally:
        go_on.set()
        await anyio.to_thread.run_sync(_join, child)
    assert omni_dev_shm() == before


@pytest.mark.skipif(not LINUX, reason="reads /proc")
async def test_sender_killed_mid_stream_leaks_nothing(tmp_sock_dir: Path) -> None:
    baseline = shmem_bytes()
    before = omni_dev_shm()
    sent = SPAWN.Queue()
    async with ShmTransport().listen(f"unix:{tmp_sock_dir}/a.sock", secret=SECRET) as rx:
        child = SPAWN.Process(target=peers.flood, args=("shm", rx.address, 16 * MB, -1, sent, None))
        child.start()
        try:
            for expected in range(3):
                message = await rx.recv()
                assert message["seq"] == expected
                assert bool((message["data"] == 7.0).all())
            del message
            for _ in range(6):  # let it get well ahead of us
                await anyio.to_thread.run_sync(sent.get, True, 60)
            assert shmem_bytes() - baseline > 40 * MB
            os.kill(child.pid, signal.SIGKILL)
        finally:
            await anyio.to_thread.run_sync(child.join, 60)
        assert child.exitcode == -signal.SIGKILL
        # What was fully sent before the kill still arrives, in order.
        seq = 2
        while True:
            with anyio.move_on_after(0.5):
                message = await rx.recv()
                assert message["seq"] == seq + 1
                seq = message["seq"]
                del message
                continue
            break
        assert seq >= 3
    assert peers.memfds(os.getpid()) == 0
    assert shmem_bytes() - baseline < 40 * MB
    assert omni_dev_shm() == before
