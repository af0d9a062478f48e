"""The frame format on a stream socket, and a reader that survives cancellation.

One message is one frame::

    header   magic "OMT1" | flags (u32) | meta length (u64), little-endian
    meta     (skeleton, buffer table, segment, forgotten segments), pickled
             plain: decoding it resolves no global at all
    buffers  the raw bytes of each inline buffer, back to back

The buffer table lists, per buffer, its kind, dtype, shape, size and where it
is: inline (in the frame, after the meta) or at an offset in a shared-memory
segment whose descriptor rides on the frame's first bytes (``SCM_RIGHTS``,
flag ``SEGMENT``). Sizes are known before the buffers arrive, so the receiver
allocates each buffer once and the kernel writes the bytes straight into it.

The reader keeps all its progress in the object, never in a suspended
coroutine: a ``recv`` cancelled half-way through a frame loses nothing, and the
next ``recv`` continues where it stopped.
"""

from __future__ import annotations

import array
import logging
import os
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from . import _segment
from ._codec import Source, build, checked_spec, decode, dumps_plain, encode, loads_plain

log = logging.getLogger(__name__)

HEADER = struct.Struct("<4sIQ")
MAGIC = b"OMT1"
SEGMENT = 1  # flag: a segment descriptor accompanies this frame
MAX_META = 1 << 30
MAX_FDS = 4  # descriptors accepted per recvmsg call; a frame carries at most one
# Copies bigger than this run in a worker thread, so that one large message
# does not stall the other stages sharing the event loop.
OFFLOAD_BYTES = 4 << 20
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)
_CTRUNC = getattr(socket, "MSG_CTRUNC", 0)


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


class Outgoing:
    """A message ready to write: its chunks and, maybe, a segment descriptor."""

    def __init__(self, chunks: list[Any], fd: int | None, keep: list[Source]) -> None:
        self.chunks = chunks
        self.fd = fd  # owned by the pool; only lent to this frame
        self._keep = keep  # the objects the chunks view must outlive the write


def _materialize(
    skeleton: bytes,
    sources: list[Source],
    in_shm: list[Source],
    offsets: list[int],
    segment: _segment.Segment | None,
    forgotten: list[int],
) -> Outgoing:
    where = {id(s): off for s, off in zip(in_shm, offsets, strict=True)}
    table = [
        (s.spec.kind, s.spec.dtype, s.spec.shape, s.spec.nbytes, where.get(id(s), -1))
        for s in sources
    ]
    inline = [s.contiguous_view() for s in sources if id(s) not in where and s.spec.nbytes]
    fd = None
    seg_info = None
    if segment is not None:
        segment.fill(in_shm, offsets)
        used = offsets[-1] + in_shm[-1].spec.nbytes
        seg_info = (segment.id, segment.size, used)
        if not segment.sent:
            fd, segment.sent = segment.fd, True
    meta = dumps_plain((skeleton, table, seg_info, forgotten))
    header = HEADER.pack(MAGIC, SEGMENT if fd is not None else 0, len(meta))
    return Outgoing([header + meta, *inline], fd, sources)


async def prepare(
    message: Any,
    *,
    pool: _segment.SegmentPool | None,
    shm_min: int | None,
    segment_for: Callable[[int], Awaitable[_segment.Segment]] | None = None,
) -> Outgoing:
    """Encode ``message``; with a pool, buffers of ``shm_min`` bytes or more go to
    a shared segment from ``segment_for`` (busy until the receiver releases it)."""
    skeleton, sources = encode(message)
    in_shm: list[Source] = []
    if pool is not None and segment_for is not None:
        in_shm = [s for s in sources if s.spec.nbytes >= (shm_min or 0)]
    offsets, used = _segment.layout(in_shm)
    segment = await segment_for(used) if in_shm and segment_for is not None else None
    forgotten = pool.take_forgotten() if pool is not None else []
    args = (skeleton, sources, in_shm, offsets, segment, forgotten)
    try:
        if sum(s.spec.nbytes for s in sources) >= OFFLOAD_BYTES:
            return await anyio.to_thread.run_sync(_materialize, *args)
        return _materialize(*args)
    except BaseException:
        if segment is not None and pool is not None:
            pool.release(segment.id)
        raise


async def write(sock: socket.socket, outgoing: Outgoing) -> None:
    """Write one frame; raises on a broken connection. Not safe to interleave."""
    views = deque(memoryview(c).cast("B") for c in outgoing.chunks)
    fds = [outgoing.fd] if outgoing.fd is not None else []
    while views:
        batch = [views[i] for i in range(min(len(views), 64))]
        try:
            if fds:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                sent = sock.sendmsg(batch, ancillary, _SEND_FLAGS)
                fds = []  # the descriptor travels with the first byte sent
            else:
                sent = sock.sendmsg(batch, (), _SEND_FLAGS)
        except (BlockingIOError, InterruptedError):
            await anyio.wait_writable(sock)
            continue
        while sent:
            head = views[0]
            if sent >= len(head):
                sent -= len(head)
                views.popleft()
            else:
                views[0] = head[sent:]
                sent = 0


class FrameReader:
    """Reads frames from one connection, a little at a time, without blocking."""

    def __init__(self, sock: socket.socket, *, fds: bool) -> None:
        self.sock = sock
        self._fds_allowed = fds
        self._fds: deque[int] = deque()
        self.releases = _segment.ReleaseWriter(sock)
        self._segments = _segment.SegmentTable(self.releases)
        self._start()

    def _start(self) -> None:
        self._header = bytearray(HEADER.size)
        self._pending: deque[memoryview] = deque([memoryview(self._header)])
        self._stage = 0  # 0 header, 1 meta, 2 buffers
        self._flags = 0
        self._meta = bytearray()
        self._frame: tuple[Any, ...] = ()
        self.mid_frame = False

    def poll(self) -> tuple[bool, Any]:
        """``(True, message)`` once a frame is complete; ``(False, None)`` if it
        needs more bytes. Raises :class:`EOFError` when the peer has gone."""
        while True:
            while self._pending:
                view = self._pending[0]
                try:
                    n = self._recv_into(view)
                except (BlockingIOError, InterruptedError):
                    return False, None
                if n == 0:
                    raise EOFError
                self.mid_frame = True
                if n == len(view):
                    self._pending.popleft()
                else:
                    self._pending[0] = view[n:]
            done, message = self._advance()
            if done:
                return True, message

    def _recv_into(self, view: memoryview) -> int:
        if not self._fds_allowed:
            return self.sock.recv_into(view)
        n, ancillary, flags, _ = self.sock.recvmsg_into([view], socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self._fds.extend(fds)
        if flags & _CTRUNC:
            raise ProtocolError("descriptors were truncated in transit")
        return n

    def _advance(self) -> tuple[bool, Any]:
        if self._stage == 0:
            magic, self._flags, meta_len = HEADER.unpack(self._header)
            if magic != MAGIC or meta_len > MAX_META:
                raise ProtocolError(f"not an omni transport frame (magic {magic!r})")
            self._meta = bytearray(meta_len)
            self._pending.append(memoryview(self._meta))
            self._stage = 1
            return False, None
        if self._stage == 1:
            try:
                skeleton, table, seg_info, forgotten = loads_plain(self._meta)
                specs = [checked_spec(kind, dtype, shape, n) for kind, dtype, shape, n, _ in table]
                offsets = [int(row[4]) for row in table]
            except Exception as exc:
                raise ProtocolError(f"unreadable frame metadata: {exc!r}") from exc
            self._segments.forget(forgotten)
            segment = None
            if seg_info is not None:
                seg_id, size, used = seg_info
                if self._flags & SEGMENT:
                    if not self._fds:
                        raise ProtocolError("a frame announced a segment but none arrived")
                    self._segments.add(seg_id, self._fds.popleft(), size)
                try:
                    segment = self._segments.lease(seg_id, used)
                except KeyError:
                    raise ProtocolError(f"unknown segment {seg_id}") from None
            if segment is not None and any(
                off >= 0 and off + spec.nbytes > used
                for spec, off in zip(specs, offsets, strict=True)
            ):
                raise ProtocolError("a buffer lies outside its shared-memory segment")
            inline = [
                bytearray(s.nbytes) if off < 0 else None
                for s, off in zip(specs, offsets, strict=True)
            ]
            self._pending.extend(memoryview(b) for b in inline if b)
            self._frame = (skeleton, specs, offsets, inline, segment)
            self._stage = 2
            return False, None
        # The frame is complete: reset first, so that a message that cannot be
        # rebuilt here (a type not allowed on the wire, a class that does not
        # import) is dropped alone, logged, and the connection stays usable.
        skeleton, specs, offsets, inline, segment = self._frame
        self._start()
        try:
            objects = [
                build(spec, segment, off, owned=False)
                if off >= 0
                else build(spec, buf, 0, owned=True)
                for spec, off, buf in zip(specs, offsets, inline, strict=True)
            ]
            return True, decode(skeleton, objects)
        except Exception as exc:
            log.error("dropped a message that cannot be decoded here: %r", exc)
            return False, None

    def close(self) -> None:
        """Close the connection and any descriptor not yet claimed by a frame."""
        self.releases.close()
        while self._fds:
            os.close(self._fds.popleft())
        self._frame = ()
        self._segments.close()
        self.sock.close()
