"""Proving that a connection comes from this deployment, before any frame is read.

Why: a Unix socket in a private directory keeps other users out, but an
abstract socket or a TCP port does not, and a frame carries a pickled
skeleton. So every connection first proves knowledge of the deployment's
secret (random bytes the runtime hands its children through the spawn, never
through a file or an environment variable), and nothing the peer sends is
decoded until it has.

The sender's proof is one message, written right after ``connect``, so that
a sender never waits for its receiver's event loop (processes start in any
order, and a send may come before the first receive, as before)::

    "OMA1" | time (u64, ns since the epoch) | nonce (32) |
    HMAC-SHA256(secret, "omni-sender" | time | nonce | receiver address)

The receiver reads exactly these 76 bytes, checks the MAC in constant time,
refuses a time more than ``MAX_SKEW`` away from its clock and a nonce it has
already accepted (a recorded proof cannot be replayed, to this receiver while
it is fresh, nor to another, whose address differs), and only then reads
frames. It answers ``HMAC(secret, "omni-receiver" | nonce)``, which the sender
checks when it next reads from the socket, and drops the connection if wrong.
The secret never crosses. On Unix sockets both ends also ask the kernel who
is at the other end (``SO_PEERCRED``) and refuse another user before a byte
is read or written. Authentication is not encryption: across hosts, run on a
private network or a tunnel.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import socket
import struct
import sys
import time

import anyio

MAGIC = b"OMA1"
NONCE_BYTES = 32
MAC_BYTES = hashlib.sha256().digest_size
HELLO = struct.Struct(f"<4sQ{NONCE_BYTES}s{MAC_BYTES}s")
MIN_SECRET_BYTES = 16
HANDSHAKE_TIMEOUT = 10.0  # seconds a connection may take to authenticate
MAX_SKEW = 120.0  # seconds between the sender's clock and the receiver's
_SENDER_LABEL, _RECEIVER_LABEL = b"omni-sender", b"omni-receiver"
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class AuthError(Exception):
    """The peer did not prove it belongs to this deployment (or is another user)."""


def new_secret() -> bytes:
    """A deployment secret: 32 random bytes."""
    return secrets.token_bytes(32)


def check_secret(secret: object, transport: str) -> bytes:
    """``secret`` as bytes, or a TypeError/ValueError a transport author can act on."""
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(
            f"{transport}: the deployment secret must be bytes, not {type(secret).__name__}"
        )
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{transport}: the deployment secret must be at least {MIN_SECRET_BYTES} bytes"
        )
    return bytes(secret)


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"|".join(parts), hashlib.sha256).digest()


def sender_hello(secret: bytes, address: str) -> tuple[bytes, bytes]:
    """The sender's proof for the receiver at ``address``, and the receiver's expected answer."""
    now = time.time_ns()
    nonce = secrets.token_bytes(NONCE_BYTES)
    mac = _mac(secret, _SENDER_LABEL, now.to_bytes(8, "little"), nonce, address.encode())
    return HELLO.pack(MAGIC, now, nonce, mac), _mac(secret, _RECEIVER_LABEL, nonce)


def peer_uid(sock: socket.socket) -> int | None:
    """The user id of the process at the other end of a Unix socket (Linux); else None."""
    if sock.family != socket.AF_UNIX or not sys.platform.startswith("linux"):
        return None
    _, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return uid


def check_peer_user(sock: socket.socket) -> None:
    """AuthError when the peer of a Unix socket runs as another user."""
    uid = peer_uid(sock)
    if uid is not None and uid != os.geteuid():
        raise AuthError(f"the peer runs as uid {uid}, not as this deployment's uid {os.geteuid()}")


class ReceiverHandshake:
    """The receiving side, driven without blocking from the receiver's poll loop.

    ``addresses`` are the names the receiver answers to (as planned, and as
    bound when the system chose the port); ``seen`` is the receiver's record
    of accepted nonces, shared by all its connections.
    """

    def __init__(
        self,
        sock: socket.socket,
        secret: bytes,
        addresses: tuple[str, ...],
        seen: dict[bytes, float],
    ) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        self._secret = secret
        self._addresses = addresses
        self._seen = seen
        self._buffer = bytearray()

    def step(self) -> bool:
        """Read what has arrived; True once the peer has proved itself.

        Raises :class:`AuthError` on a wrong proof, ``EOFError`` when the peer
        hung up; ``BlockingIOError`` never escapes.
        """
        while len(self._buffer) < HELLO.size:
            try:
                data = self.sock.recv(HELLO.size - len(self._buffer))
            except (BlockingIOError, InterruptedError):
                return False
            if not data:
                raise EOFError
            self._buffer += data
            if self._buffer[: len(MAGIC)] != MAGIC[: len(self._buffer)]:
                # Not our protocol at all: no need to wait for the rest of a proof.
                raise AuthError(f"not an omni handshake (greeting {bytes(self._buffer[:8])!r})")
        self._check(bytes(self._buffer))
        return True

    def _check(self, hello: bytes) -> None:
        magic, sent_ns, nonce, mac = HELLO.unpack(hello)
        if magic != MAGIC:
            raise AuthError(f"not an omni handshake (greeting {hello[:8]!r})")
        stamp = sent_ns.to_bytes(8, "little")
        expected = [
            _mac(self._secret, _SENDER_LABEL, stamp, nonce, a.encode()) for a in self._addresses
        ]
        if not any(hmac.compare_digest(mac, e) for e in expected):
            raise AuthError("wrong proof of the deployment secret")
        now = time.time()
        skew = abs(now - sent_ns / 1e9)
        if skew > MAX_SKEW:
            raise AuthError(
                f"the proof is {skew:.0f} s away from this host's clock (more than "
                f"{MAX_SKEW:g} s): a replay, or clocks out of sync"
            )
        for old in [n for n, expiry in self._seen.items() if expiry < now]:
            del self._seen[old]
        if nonce in self._seen:
            raise AuthError("a proof this receiver has already accepted (a replay)")
        self._seen[nonce] = now + 2 * MAX_SKEW
        answer = _mac(self._secret, _RECEIVER_LABEL, nonce)
        # 32 bytes into a fresh connection's empty send buffer. A sender that
        # has already closed its end (it sent its frames and left) cannot hear
        # the answer, but has proved itself: its frames are still read.
        with contextlib.suppress(OSError):
            self.sock.send(answer)


async def send_all(sock: socket.socket, data: bytes) -> None:
    """Write ``data`` to a non-blocking socket, waiting while its buffer is full."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except (BlockingIOError, InterruptedError):
            await anyio.wait_writable(sock)


def check_answer(received: bytes, expected: bytes) -> None:
    """AuthError unless the receiver's answer proves it knows the secret."""
    if not hmac.compare_digest(received, expected):
        raise AuthError("the receiver does not know this deployment's secret")
