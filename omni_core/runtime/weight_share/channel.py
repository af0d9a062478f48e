"""The leader's weight socket: manifests and memory descriptors, to proven peers only.

The leader listens on a Unix socket in the deployment's private runtime
directory. A follower connects and proves it knows the deployment's secret
with the same handshake every transport uses (:mod:`..transports._auth`: an
HMAC over a fresh nonce and this socket's path, and ``SO_PEERCRED`` refuses
another user); only then does the leader read its request. The request names
a key; the answer is a JSON manifest (tensor names, dtypes, shapes, offsets,
or CUDA IPC handles) and, for host memory, the ``memfd`` descriptor itself
(``SCM_RIGHTS``). Nothing crossing here is ever unpickled or executed.

Why a socket of the leader's and not the parent: the descriptor then never
outlives the leader in a third process. A dead leader's memory is freed by
the kernel once its followers (restarted with it) let go of their mappings.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from ..transports._auth import (
    HANDSHAKE_TIMEOUT,
    MAC_BYTES,
    AuthError,
    ReceiverHandshake,
    check_answer,
    check_peer_user,
    sender_hello,
)

LENGTH = struct.Struct("<I")
MAX_REQUEST = 4096  # a key and nothing else
MAX_MANIFEST = 64 << 20  # thousands of tensors fit in a few MB


class ShareError(RuntimeError):
    """A follower could not map its leader's weights: which key, which leader, why."""


Lookup = Callable[[str], tuple[dict[str, Any], int | None]]


class WeightServer:
    """Answers followers' requests from a thread, until closed.

    ``lookup(key)`` returns (manifest, descriptor or None) or raises
    KeyError. Requests are served one at a time: followers are few and each
    asks once per key at start-up.
    """

    def __init__(self, address: str, secret: bytes, lookup: Lookup):
        self.address, self._secret, self._lookup = address, secret, lookup
        self._seen: dict[bytes, float] = {}
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)  # a previous leader's socket (a restart)
        self._sock.bind(address)
        os.chmod(address, 0o600)
        self._sock.listen(16)
        self.served = 0
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="weight-share", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    self._answer(conn)
                except (OSError, EOFError, AuthError, ValueError) as exc:
                    print(f"weight sharing: refused a request: {exc}", flush=True)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(HANDSHAKE_TIMEOUT)
        check_peer_user(conn)
        handshake = ReceiverHandshake(conn, self._secret, (self.address,), self._seen)
        while not handshake.step():  # a blocking socket: step reads until the proof is in
            pass
        request = json.loads(_read_frame(conn, MAX_REQUEST))
        key = request.get("key") if isinstance(request, dict) else None
        if not isinstance(key, str):
            raise ValueError("a request without a key")
        try:
            manifest, fd = self._lookup(key)
        except KeyError as exc:
            _send_frame(conn, {"error": str(exc.args[0]) if exc.args else key})
            return
        body = json.dumps(manifest).encode()
        header = LENGTH.pack(len(body))
        if fd is None:
            conn.sendall(header)
        else:
            socket.send_fds(conn, [header], [fd])
        conn.sendall(body)
        self.served += 1

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(2.0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.address)


def fetch(address: str, secret: bytes, key: str, leader: str) -> tuple[dict[str, Any], int | None]:
    """Ask the leader at ``address`` for ``key``: (manifest, descriptor or None).

    Raises :class:`ShareError` naming the leader and the reason.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HANDSHAKE_TIMEOUT)
    fds: list[int] = []
    try:
        try:
            sock.connect(address)
        except OSError as exc:
            raise ShareError(
                f"cannot reach weight-sharing leader {leader} at {address}: {exc.strerror}; "
                "it should have started before this follower"
            ) from None
        check_peer_user(sock)
        hello, expected = sender_hello(secret, address)
        sock.sendall(hello)
        check_answer(_read_exact(sock, MAC_BYTES), expected)
        _send_frame(sock, {"key": key})
        header, fds, _, _ = socket.recv_fds(sock, LENGTH.size, 1)
        header += _read_exact(sock, LENGTH.size - len(header)) if len(header) < 4 else b""
        (size,) = LENGTH.unpack(header)
        if size > MAX_MANIFEST:
            raise ValueError(f"a manifest of {size} bytes (at most {MAX_MANIFEST})")
        answer = json.loads(_read_exact(sock, size))
        if not isinstance(answer, dict):
            raise ValueError("a manifest that is not a JSON object")
    except (OSError, EOFError, AuthError, ValueError) as exc:
        for fd in fds:
            os.close(fd)
        raise ShareError(
            f"weight-sharing leader {leader} did not hand over {key!r}: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        sock.close()
    if "error" in answer:
        for fd in fds:
            os.close(fd)
        raise ShareError(
            f"weight-sharing leader {leader} has published no weights under {key!r} "
            f"({answer['error']}); leader and followers must load the same model with the "
            "same settings"
        )
    return answer, (fds[0] if fds else None)


def _send_frame(sock: socket.socket, data: dict[str, Any]) -> None:
    body = json.dumps(data).encode()
    sock.sendall(LENGTH.pack(len(body)) + body)


def _read_frame(sock: socket.socket, limit: int) -> bytes:
    (size,) = LENGTH.unpack(_read_exact(sock, LENGTH.size))
    if size > limit:
        raise ValueError(f"a request of {size} bytes (at most {limit})")
    return _read_exact(sock, size)


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the peer hung up")
        data += chunk
    return bytes(data)
