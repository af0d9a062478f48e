"""Channels over stream sockets (Unix or TCP), shared by ``socket`` and ``shm``.

Why anyio and the standard library, not pyzmq: the frames we need are simple
(a length-prefixed header, then raw buffers), and two things matter more than
a messaging library's features. (1) Large buffers must go from the kernel
straight into the receiving tensor: ``recv_into`` a freshly allocated tensor
does that, where zmq hands us its own frame to copy out of. (2) The shm
transport passes segment descriptors with ``SCM_RIGHTS``, which zmq cannot
carry. anyio is already a core dependency and gives backend-neutral waiting
on a socket (``wait_readable`` / ``wait_writable``), so the sockets stay
non-blocking and nothing polls: a receiver with no data sleeps in the event
loop. What we give up (zmq's reconnecting sockets) is a few lines here: a
sender connects on first use, retrying while the receiver is not up yet, and
reconnects after a broken connection.

Peers are not trusted until they prove it: every connection first passes the
handshake of :mod:`._auth` (the deployment's secret, and on Unix sockets the
peer's user id), and only then is a frame read; a frame's skeleton is decoded
by an unpickler that builds plain data and registered types only
(:mod:`omni_core.wire`), so even an authenticated peer cannot run code.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import time
import weakref
from typing import Any

import anyio

from ...transport import AddressError, Channel, ChannelClosed
from ._address import SocketAddress
from ._auth import (
    MAC_BYTES,
    AuthError,
    ReceiverHandshake,
    check_answer,
    check_peer_user,
    check_secret,
    send_all,
    sender_hello,
)
from ._segment import POOL_BYTES, RELEASE, Segment, SegmentPool
from ._wire import FrameReader, ProtocolError, prepare, write

log = logging.getLogger(__name__)
ACCEPT_REPORT_INTERVAL = 10.0  # seconds between two reports of failing accepts

BUFFER_BYTES = 4 << 20  # socket buffers: fewer wake-ups per large message
CONNECT_TIMEOUT = 60.0  # how long a first send waits for its receiver to appear
# How long a shm sender whose pool is spent waits for the receiver to release a
# segment before it allocates one more (backpressure that cannot deadlock).
POOL_WAIT = 1.0
_RETRYABLE = (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, BlockingIOError)
MAX_HANDSHAKES = 64  # connections authenticating at once; the oldest is dropped beyond


def _tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, BUFFER_BYTES)
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _claim_unix_path(path: str, transport: str) -> None:
    """Remove a stale socket file at ``path``; refuse if someone listens there."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise AddressError(
            f"{transport}: {path} exists and is not a socket", hint="choose another path"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # left by a process that died without closing
        return
    except FileNotFoundError:
        return
    finally:
        probe.close()
    raise AddressError(
        f"{transport}: another receiver already listens at unix:{path}",
        hint="each edge needs its own address",
    )


def bind(address: SocketAddress, transport: str) -> tuple[socket.socket, str, int | None]:
    """A listening socket at ``address``, its address as bound, and the inode to unlink."""
    if address.scheme == "unix":
        if not address.abstract:
            _claim_unix_path(address.path, transport)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address.bind_target())
        sock.listen(128)
    except (OSError, socket.gaierror) as exc:
        sock.close()
        reason = "address in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise AddressError(f"{transport}: cannot listen at {address}: {reason}") from exc
    _tune(sock)
    inode = None
    if address.scheme == "unix" and not address.abstract:
        os.chmod(address.path, 0o600)  # only our user may connect (the peer check says so too)
        inode = os.stat(address.path).st_ino
    bound = address
    if address.scheme == "tcp":
        bound = SocketAddress("tcp", host=address.host, port=sock.getsockname()[1])
    return sock, str(bound), inode


def _release(listener: socket.socket, path: str, inode: int | None) -> None:
    """Close ``listener`` and remove its socket file if it is still ours."""
    listener.close()
    if inode is not None:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:
                os.unlink(path)


class _FirstReadable:
    """Waits for the first of several sockets to become readable, on asyncio's reader callbacks.

    One future per wait, woken by the loop: no waiter task per socket, which
    cost a receiver with several senders most of a message's latency
    (0.56 ms per hop, 0.12 ms with this). ``close`` (from the receiver's
    ``aclose``, before its sockets close) unregisters the sockets at once and
    fails the wait with ClosedResourceError, so a closed descriptor is never
    left registered, nor unregistered later when its number may be reused.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[socket.socket] | None = None
        self._fds: list[int] = []

    async def wait(self, socks: list[socket.socket]) -> socket.socket:
        loop = _asyncio_loop()
        if len(socks) == 1 or loop is None:
            return await _wait_any_tasks(socks)
        self._loop = loop
        future = self._future = loop.create_future()
        try:
            for sock in socks:
                fd = sock.fileno()
                if fd < 0:
                    raise anyio.ClosedResourceError
                loop.add_reader(fd, self._wake, future, sock)
                self._fds.append(fd)
            return await future
        finally:
            self._release()

    @staticmethod
    def _wake(future: asyncio.Future[socket.socket], sock: socket.socket) -> None:
        if not future.done():
            future.set_result(sock)

    def _release(self) -> None:
        if self._loop is not None:
            for fd in self._fds:
                self._loop.remove_reader(fd)
        self._fds = []

    def close(self) -> None:
        self._release()
        if self._future is not None and not self._future.done():
            self._future.set_exception(anyio.ClosedResourceError())


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop; None under another anyio backend (trio)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _wait_any_tasks(socks: list[socket.socket]) -> socket.socket:
    """The first of ``socks`` to become readable (one waiter task per socket)."""
    if len(socks) == 1:
        await anyio.wait_readable(socks[0])
        return socks[0]
    woke: list[socket.socket] = []
    async with anyio.create_task_group() as group:

        async def watch(sock: socket.socket) -> None:
            await anyio.wait_readable(sock)
            woke.append(sock)
            group.cancel_scope.cancel()

        for sock in socks:
            group.start_soon(watch, sock)
    return woke[0]


class StreamReceiver(Channel):
    """The listening end: accepts any number of senders, reads whole frames."""

    def __init__(self, address: SocketAddress, *, transport: str, fds: bool, secret: bytes) -> None:
        self._transport = transport
        self._fds = fds
        self._secret = check_secret(secret, transport)
        self._listener, self.address, inode = bind(address, transport)
        self._names = tuple(dict.fromkeys((str(address), self.address)))  # as asked, as bound
        self._seen: dict[bytes, float] = {}  # nonces of accepted proofs (no replays)
        self._readers: list[FrameReader] = []
        self._handshakes: list[ReceiverHandshake] = []  # accepted, not yet authenticated
        self._turn = 0
        self._accept_failures = 0  # since the last report (see _accept_failed)
        self._accept_reported = -ACCEPT_REPORT_INTERVAL
        self._polls = 0
        self._pending_accept = True
        self._closed = False
        self._lock = anyio.Lock(fast_acquire=True)
        self._waiter = _FirstReadable()
        # Remove the socket file even if the owner forgets to close (not on SIGKILL:
        # then the next listener at this path finds the file stale and reclaims it).
        self._finalizer = weakref.finalize(self, _release, self._listener, address.path, inode)

    async def send(self, message: Any) -> None:
        raise TypeError(f"this is the receiving end of a {self._transport} edge")

    async def recv(self) -> Any:
        async with self._lock:
            while True:
                if self._closed:
                    raise ChannelClosed(f"{self._transport} receiver at {self.address} is closed")
                found, message = self._poll()
                if found:
                    return message
                # A connection in the middle of a frame is served alone until the
                # frame is whole; otherwise wait for whichever socket wakes first.
                busy = [r.sock for r in self._readers if r.mid_frame][:1]
                waiting = [h.sock for h in self._handshakes]
                # A connection that stalls its handshake is dropped at its deadline
                # even when nothing else wakes us.
                timeout = (
                    max(0.0, min(h.deadline for h in self._handshakes) - time.monotonic())
                    if waiting and not busy
                    else None
                )
                try:
                    with anyio.move_on_after(timeout):
                        woke = await self._waiter.wait(
                            busy or [self._listener, *(r.sock for r in self._readers), *waiting]
                        )
                        self._pending_accept = woke is self._listener
                except anyio.ClosedResourceError:
                    continue  # closed under us: the loop reports it

    def _poll(self) -> tuple[bool, Any]:
        # Accept when the listener woke us, and now and then while data keeps
        # flowing (so a busy sender cannot starve a new one): accept() on an
        # empty backlog costs an exception each time.
        self._polls += 1
        if self._pending_accept or not self._readers or self._polls % 32 == 0:
            self._pending_accept = False
            self._accept()
        if self._handshakes:
            self._authenticate()
        count = len(self._readers)
        for step in range(count):
            reader = self._readers[(self._turn + step) % count]
            reader.releases.flush()
            try:
                found, message = reader.poll()
            except (EOFError, OSError, ProtocolError) as exc:
                # A sender that left between frames is no news. (A reset instead of
                # an end: it closed with our handshake answer unread.)
                if reader.mid_frame or not isinstance(exc, (EOFError, ConnectionResetError)):
                    log.warning(
                        "%s: dropped a connection to %s: %r", self._transport, self.address, exc
                    )
                self._drop(reader)
                return self._poll()
            if found:
                self._turn = (self._turn + step + 1) % count
                return True, message
        return False, None

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of descriptors: try again on the next wake-up
                self._accept_failed(exc)
                return
            _tune(sock)
            try:
                check_peer_user(sock)
            except (AuthError, OSError) as exc:
                self._refuse(sock, exc)
                continue
            if len(self._handshakes) >= MAX_HANDSHAKES:
                oldest = self._handshakes.pop(0)
                self._refuse(oldest.sock, AuthError("too many connections authenticating"))
            self._handshakes.append(ReceiverHandshake(sock, self._secret, self._names, self._seen))

    def _accept_failed(self, exc: OSError) -> None:
        """Report a failed accept at most once per interval, with a count of the others.

        Out of descriptors, every wake-up of the receiver fails again: a flood of
        clients on the HTTP port printed one line per wake-up (2.5 MB of log).
        """
        self._accept_failures += 1
        now = time.monotonic()
        if now - self._accept_reported < ACCEPT_REPORT_INTERVAL:
            return
        more = self._accept_failures - 1
        log.warning(
            "%s: accept failed at %s: %r%s",
            self._transport,
            self.address,
            exc,
            f" ({more} more since the last report)" if more else "",
        )
        self._accept_failures, self._accept_reported = 0, now

    def _authenticate(self) -> None:
        """Advance every pending handshake; an authenticated peer's frames are read next."""
        now = time.monotonic()
        for handshake in list(self._handshakes):
            try:
                if handshake.step():
                    self._handshakes.remove(handshake)
                    self._readers.append(FrameReader(handshake.sock, fds=self._fds))
                    continue
                if now > handshake.deadline:
                    raise AuthError("no proof of the deployment secret in time")
            except (AuthError, EOFError, OSError) as exc:
                self._handshakes.remove(handshake)
                self._refuse(handshake.sock, exc)

    def _refuse(self, sock: socket.socket, reason: BaseException) -> None:
        """Close a connection that did not authenticate; nothing it sent was decoded."""
        if not isinstance(reason, EOFError):
            log.warning("%s: refused a connection to %s: %s", self._transport, self.address, reason)
        sock.close()

    def _drop(self, reader: FrameReader) -> None:
        self._readers.remove(reader)
        reader.close()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._waiter.close()  # before the sockets close: see _FirstReadable
        for sock in [
            self._listener,
            *(r.sock for r in self._readers),
            *(h.sock for h in self._handshakes),
        ]:
            anyio.notify_closing(sock)
        for reader in list(self._readers):
            self._drop(reader)  # queued frames and their segments are released here
        for handshake in self._handshakes:
            handshake.sock.close()
        self._handshakes.clear()
        self._finalizer()


class StreamSender(Channel):
    """The connecting end: connects on first send, reconnects after a break."""

    def __init__(
        self,
        address: SocketAddress,
        *,
        transport: str,
        shm_min: int | None,
        secret: bytes,
        pool_bytes: int = POOL_BYTES,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self._secret = check_secret(secret, transport)
        self.address = str(address)
        self._target = address
        self._transport = transport
        self._shm_min = shm_min
        self._connect_timeout = connect_timeout
        self._pool_bytes = pool_bytes
        self._sock: socket.socket | None = None
        self._pool: SegmentPool | None = None  # shared memory of this connection
        self._notices = bytearray()
        self._answer = bytearray()  # the receiver's proof, as it arrives
        self._expected_answer = b""
        self._closed = False
        self._lock = anyio.Lock(fast_acquire=True)

    async def send(self, message: Any) -> None:
        async with self._lock:
            if self._closed:
                raise ChannelClosed(f"{self._transport} sender to {self.address} is closed")
            sock = self._sock or await self._connect()
            try:
                self._drain(sock)
                outgoing = await prepare(
                    message, pool=self._pool, shm_min=self._shm_min, segment_for=self._segment_for
                )
                await write(sock, outgoing)
            except BaseException as exc:
                # Part of a frame may be out: only a fresh connection is safe now.
                self._disconnect()
                if isinstance(exc, OSError):
                    raise ChannelClosed(
                        f"{self._transport}: lost the receiver at {self.address}: {exc}"
                    ) from exc
                raise

    async def _segment_for(self, nbytes: int) -> Segment:
        """A pooled segment; when the pool is spent, wait (bounded) for releases."""
        pool, sock = self._pool, self._sock
        assert pool is not None and sock is not None
        deadline = anyio.current_time() + POOL_WAIT
        while True:
            segment = pool.acquire(nbytes)
            if segment is not None:
                return segment
            remaining = deadline - anyio.current_time()
            if nbytes > pool.budget or remaining <= 0:
                # The receiver holds on to what it got: don't stall, spend more memory.
                return pool.one_off(nbytes)
            with anyio.move_on_after(remaining):
                await anyio.wait_readable(sock)
            self._drain(sock)

    def _drain(self, sock: socket.socket) -> None:
        """Read the receiver's release notices; notice a receiver that has gone."""
        while True:
            try:
                data = sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                raise ConnectionResetError(errno.ECONNRESET, "the receiver closed the connection")
            if len(self._answer) < MAC_BYTES:  # the receiver's proof comes first
                take = MAC_BYTES - len(self._answer)
                self._answer += data[:take]
                data = data[take:]
                if len(self._answer) == MAC_BYTES:
                    self._check_answer()
            self._notices += data
        whole = len(self._notices) - len(self._notices) % RELEASE.size
        if whole and self._pool is not None:
            for (seg_id,) in RELEASE.iter_unpack(self._notices[:whole]):
                self._pool.release(seg_id)
        del self._notices[:whole]

    def _check_answer(self) -> None:
        try:
            check_answer(bytes(self._answer), self._expected_answer)
        except AuthError as exc:
            log.warning("%s: dropped the receiver at %s: %s", self._transport, self.address, exc)
            # An OSError: send() turns it into ChannelClosed after disconnecting.
            raise ConnectionAbortedError(
                errno.ECONNABORTED, f"the receiver at {self.address} failed authentication"
            ) from None

    async def recv(self) -> Any:
        raise TypeError(f"this is the sending end of a {self._transport} edge")

    async def _connect(self) -> socket.socket:
        deadline = anyio.current_time() + self._connect_timeout
        delay = 0.002
        while True:
            try:
                self._sock = await self._open()
                if self._shm_min is not None:
                    self._pool = SegmentPool(self._pool_bytes)
                return self._sock
            except _RETRYABLE as exc:
                if anyio.current_time() >= deadline:
                    raise ChannelClosed(
                        f"{self._transport}: no receiver at {self.address} "
                        f"after {self._connect_timeout:g} s ({exc.strerror or exc!r})"
                    ) from exc
            await anyio.sleep(delay)  # waiting for a peer process to start, not polling data
            delay = min(delay * 2, 0.2)

    async def _open(self) -> socket.socket:
        target = self._target
        if target.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: Any = target.bind_target()
        else:
            try:
                infos = await anyio.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise AddressError(f"{self._transport}: cannot resolve {target}: {exc}") from exc
            family, _, _, _, address = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            _tune(sock)
            try:
                sock.connect(address)
            except BlockingIOError:
                if target.scheme == "unix":
                    raise  # the receiver's backlog is full: retry later
                await anyio.wait_writable(sock)
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, os.strerror(error)) from None
        except BaseException:
            sock.close()
            raise
        try:
            check_peer_user(sock)
            hello, self._expected_answer = sender_hello(self._secret, self.address)
            await send_all(sock, hello)
        except AuthError as exc:
            sock.close()
            raise ChannelClosed(
                f"{self._transport}: refused the receiver at {self.address}: {exc}"
            ) from None
        except BaseException:
            sock.close()
            raise
        self._answer = bytearray()
        return sock

    def _disconnect(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._notices.clear()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def aclose(self) -> None:
        self._closed = True
        if self._sock is not None:
            anyio.notify_closing(self._sock)
        self._disconnect()
