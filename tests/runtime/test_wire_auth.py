"""The decoder runs no code; the handshake admits only this deployment's peers."""

from __future__ import annotations

import dataclasses
import enum
import os
import pickle
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch

from omni_core.runtime.transports import ShmTransport, SocketTransport
from omni_core.runtime.transports._auth import sender_hello
from omni_core.runtime.transports._codec import (
    WireFormatError,
    checked_spec,
    decode,
    encode,
    loads_plain,
)
from omni_core.runtime.transports._wire import prepare
from omni_core.transport import ChannelClosed
from omni_core.wire import WireTypeError, allow_wire_types, allowed_wire_types, type_name

pytestmark = pytest.mark.anyio
SECRET = b"unit-test-deployment-secret-0001"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="omni-w-") as name:
        yield Path(name)


class Marker:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@dataclasses.dataclass
class Registered:
    value: int


class Colour(enum.Enum):
    RED = "red"


class Unregistered:
    pass


# -- the codec ----------------------------------------------------------------


def test_decoding_refuses_any_global_that_is_not_allowed(tmp_path):
    marker = tmp_path / "ran"
    for payload in (pickle.dumps(Marker(str(marker))), pickle.dumps(print), pickle.dumps(Marker)):
        with pytest.raises(pickle.UnpicklingError, match="not a type allowed on the wire"):
            decode(payload, [])
    assert not marker.exists()


def test_frame_metadata_may_name_no_global_at_all():
    assert loads_plain(pickle.dumps((b"x", [("torch", "float32", (2,), 8, -1)], None, [])))
    with pytest.raises(pickle.UnpicklingError):
        loads_plain(pickle.dumps(dataclasses.replace))


def test_the_sender_refuses_what_the_receiver_would_with_the_types_name():
    with pytest.raises(WireTypeError, match=f"{__name__}:Unregistered") as refused:
        encode({"ok": [1, 2], "bad": Unregistered()})
    assert "omni_register_wire_types" in str(refused.value)
    with pytest.raises(WireTypeError, match="builtins:function"):
        encode({"callback": lambda: None})


def test_registered_types_and_plain_data_cross_and_come_back_equal():
    allow_wire_types([Registered, f"{Colour.__module__}:{Colour.__qualname__}"])
    message = {
        "r": Registered(3),
        "c": Colour.RED,
        "plain": (1, 2.5, "s", b"b", None, True, {1, 2}, frozenset({3}), 1 + 2j, range(3)),
    }
    skeleton, sources = encode(message)
    assert not sources and decode(skeleton, []) == message
    assert type_name(Registered) in allowed_wire_types()


def test_buffers_keep_their_zero_copy_path_and_odd_dtypes():
    structured = np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")])
    message = {
        "t": torch.arange(6.0).reshape(2, 3),
        "s": structured,
        "p": torch.nn.Parameter(torch.ones(2)),
    }
    skeleton, sources = encode(message)
    assert len(sources) == 3
    assert b"float32" not in skeleton  # dtypes travel in the buffer table, as plain strings
    objects = [bytes(s.contiguous_view()) for s in sources]
    from omni_core.runtime.transports._codec import build

    rebuilt = [
        build(s.spec, bytearray(o), 0, owned=True) for s, o in zip(sources, objects, strict=True)
    ]
    back = decode(skeleton, rebuilt)
    assert torch.equal(back["t"], message["t"]) and type(back["p"]) is torch.Tensor
    assert back["s"].dtype == structured.dtype and back["s"].tolist() == structured.tolist()


def test_object_arrays_and_sparse_tensors_are_refused_on_the_sending_side():
    with pytest.raises(WireTypeError, match="dtype object"):
        encode(np.array([object()]))
    with pytest.raises(WireTypeError, match="to_dense"):
        encode(torch.eye(3).to_sparse())


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (("torch", "load", (1,), 4), "not a torch dtype"),
        (("torch", "float32", (10,), 4), "does not make 4 bytes"),
        (("numpy", "|O", (1,), 8), "object-dtype"),
        (("numpy", "<f4", (-1,), 4), "not a shape"),
        (("pickle", None, (1,), 1), "unknown buffer kind"),
    ],
)
def test_a_buffer_table_that_this_codec_would_not_write_is_refused(row, words):
    with pytest.raises(WireFormatError, match=words):
        checked_spec(*row)


# -- the handshake --------------------------------------------------------------


@pytest.mark.parametrize("transport", [ShmTransport(), SocketTransport()], ids=["shm", "socket"])
async def test_a_sender_with_another_secret_is_refused_and_the_receiver_goes_on(
    transport, sock_dir, caplog
):
    async with transport.listen(f"unix:{sock_dir}/edge.sock", secret=SECRET) as rx:
        intruder = transport.connect(rx.address, secret=os.urandom(32))
        friend = transport.connect(rx.address, secret=SECRET)
        await intruder.send({"who": "intruder", "t": torch.ones(100_000)})
        await friend.send({"who": "friend"})
        assert (await rx.recv())["who"] == "friend"
        with anyio.move_on_after(0.5) as waited:
            await rx.recv()
        assert waited.cancelled_caught  # nothing else arrives, ever
        with pytest.raises(ChannelClosed, match=r"lost the receiver|failed authentication"):
            for _ in range(50):  # the refusal closes the intruder's connection
                await intruder.send({"who": "intruder"})
                await anyio.sleep(0.02)
        await friend.send({"who": "friend", "n": 2})
        assert (await rx.recv()) == {"who": "friend", "n": 2}
        await intruder.aclose()
        await friend.aclose()
    assert "wrong proof of the deployment secret" in caplog.text


async def _frame(message: object) -> bytes:
    outgoing = await prepare(message, pool=None, shm_min=None)
    return b"".join(bytes(c) for c in outgoing.chunks)


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the other end closed (a reset, when it left our bytes unread)."""
    sock.settimeout(5)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


async def test_a_recorded_proof_cannot_be_replayed(sock_dir, caplog):
    async with SocketTransport().listen(f"unix:{sock_dir}/r.sock", secret=SECRET) as rx:
        hello, _ = sender_hello(SECRET, rx.address)
        first = await _frame({"n": 1})

        def write(payload: bytes) -> socket.socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(rx.address.removeprefix("unix:"))
            sock.sendall(payload)
            return sock

        honest = write(hello + first)
        assert await rx.recv() == {"n": 1}
        replay = write(hello + await _frame({"n": 2}))
        with anyio.move_on_after(0.5) as waited:
            await rx.recv()
        assert waited.cancelled_caught
        assert closed_by_peer(replay)
        honest.close()
        replay.close()
    assert "a proof this receiver has already accepted (a replay)" in caplog.text


async def test_a_proof_for_another_receiver_is_refused(sock_dir):
    async with SocketTransport().listen(f"unix:{sock_dir}/a.sock", secret=SECRET) as rx:
        hello, _ = sender_hello(SECRET, f"unix:{sock_dir}/b.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(f"{sock_dir}/a.sock")
        sock.sendall(hello + await _frame({"n": 1}))
        with anyio.move_on_after(0.5) as waited:
            await rx.recv()
        assert waited.cancelled_caught
        sock.close()


#: A peer that connects as uid 65534 and sends its standard input; exits 0 when the
#: receiver closes on it without a word, 1 when it answers. It imports what it needs
#: before dropping root, so nothing it loads afterwards must be readable by nobody.
PEER_AS_NOBODY = """
import os, socket, sys
payload = sys.stdin.buffer.read()
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect("\\0" + sys.argv[1])
try:
    sock.sendall(payload)
except (BrokenPipeError, ConnectionResetError):
    pass  # the refusal may close on us mid-write
sock.settimeout(5)
try:
    closed = sock.recv(100) == b""
except ConnectionResetError:
    closed = True
sys.exit(0 if closed else 1)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a peer as another user")
async def test_another_user_is_refused_before_a_byte_is_read(caplog):
    name = f"omni-peer-test-{os.getpid()}"
    async with SocketTransport().listen(f"unix:@{name}", secret=SECRET) as rx:
        # Even with the secret, another uid is refused by the kernel's word (SO_PEERCRED).
        payload = sender_hello(SECRET, rx.address)[0] + await _frame({"from": "nobody"})

        def peer_as_nobody() -> int:
            """0 if the receiver closed on us without a word, else why not: a fresh
            interpreter that drops to uid 65534 itself (never a fork of this threaded
            worker, whose child freed another thread's PyAV scaler on the way out of
            os.fork and hung there, and a CI run with it, in waitpid)."""
            peer = subprocess.run(
                [sys.executable, "-I", "-c", PEER_AS_NOBODY, name],
                input=payload,
                capture_output=True,
                timeout=60,
            )
            assert peer.returncode in (0, 1), peer.stderr.decode(errors="replace")
            return peer.returncode

        async with anyio.create_task_group() as group:
            outcome: list[int] = []

            async def run_peer() -> None:
                outcome.append(await anyio.to_thread.run_sync(peer_as_nobody))

            group.start_soon(run_peer)
            with anyio.move_on_after(3) as waited:
                await rx.recv()
            assert waited.cancelled_caught
        assert outcome == [0]
    assert "runs as uid 65534" in caplog.text


async def test_a_stalled_handshake_is_dropped_at_its_deadline(sock_dir, monkeypatch):
    from omni_core.runtime.transports import _auth

    monkeypatch.setattr(_auth, "HANDSHAKE_TIMEOUT", 0.3)
    async with SocketTransport().listen(f"unix:{sock_dir}/s.sock", secret=SECRET) as rx:
        stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stalled.connect(f"{sock_dir}/s.sock")
        stalled.sendall(b"OMA1")  # and then nothing
        with anyio.move_on_after(1.0):
            await rx.recv()
        assert closed_by_peer(stalled)
        stalled.close()


@pytest.mark.parametrize("transport", [ShmTransport(), SocketTransport()], ids=["shm", "socket"])
async def test_a_sender_that_leaves_before_the_answer_is_still_heard(transport, sock_dir):
    async with transport.listen(f"unix:{sock_dir}/quick.sock", secret=SECRET) as rx:
        for n in range(3):  # connect, send, close: before the receiver has even accepted
            tx = transport.connect(rx.address, secret=SECRET)
            await tx.send({"n": n, "t": torch.full((100_000,), float(n))})
            await tx.aclose()
        with anyio.fail_after(10):
            received = [await rx.recv() for _ in range(3)]
    assert sorted(m["n"] for m in received) == [0, 1, 2]
    assert all(float(m["t"][-1]) == m["n"] for m in received)
