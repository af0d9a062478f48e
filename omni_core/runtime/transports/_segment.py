"""Shared-memory segments that cannot leak, and are reused while warm.

Why not named POSIX segments (``multiprocessing.shared_memory``): a name in
/dev/shm outlives every process until someone unlinks it, so a sender killed
at the wrong moment, or a receiver closed with messages in flight, leaves
memory behind that only a sweeper could find. A segment here is a ``memfd``
(Linux): an anonymous file with no name at all. Its memory lives exactly as
long as some descriptor or mapping refers to it, and the kernel drops those
when a process exits or when a socket holding in-flight descriptors closes.
Elsewhere than Linux an unlinked temporary file plays the memfd's part.

Why reuse: on Linux, handing out fresh shared pages (zeroing, page-cache
insertion, page faults) runs at 1-2 GB/s, several times slower than copying
into pages already mapped. So the sender keeps a pool of segments per
connection, each mapped once on both sides, and writes into them again once
the receiver has let go.

Ownership rule (who frees what, when):

1. The *sender* creates segments, one connection's pool at a time. The first
   frame that uses a segment carries its descriptor (``SCM_RIGHTS``); later
   frames name it by id only.
2. The *receiver* maps each segment once and keeps the mapping for the life of
   the connection. A message's tensors and arrays *view* its segment (no
   second copy) through a lease; when the last of them is garbage-collected,
   the receiver writes the segment's id back on the socket ("release").
3. A released segment is free for the sender to fill again. Beyond the pool's
   byte budget the sender closes it instead and names it in its next frame
   ("forget"), and the receiver drops its mapping.
4. When the connection ends, for any reason (either side closes, or dies),
   each side closes every descriptor and mapping of that connection; a
   receiver's tensors still alive keep only their own pages, which the kernel
   frees with the last of them. Descriptors still in flight die with the
   socket.

No segment ever has a name, so nothing can be left in /dev/shm; what a dead
process held is released by the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ._codec import Source

NAME = "omni-shm"  # shows as "/memfd:omni-shm (deleted)" in /proc/PID/fd and maps
ALIGN = 64  # offsets of buffers inside a segment: cache lines, any dtype's alignment
POOL_BYTES = 1 << 30  # per connection: how much the sender keeps for reuse
RELEASE = struct.Struct("<Q")  # a release notice: the segment id
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # pre-fault pages in one call


def layout(sources: Sequence[Source]) -> tuple[list[int], int]:
    """Offsets of ``sources`` in one segment, and the bytes they take."""
    offsets, size = [], 0
    for source in sources:
        offsets.append(size)
        size += -(-source.spec.nbytes // ALIGN) * ALIGN
    return offsets, size


def _rounded(size: int) -> int:
    """``size`` rounded up so that near sizes share segments (at most 1/8 waste)."""
    step = max(64 << 10, 1 << max(size.bit_length() - 4, 0))
    return -(-size // step) * step


def _anonymous_fd(size: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(NAME, os.MFD_CLOEXEC)
    else:  # pragma: no cover - not Linux
        fd, path = tempfile.mkstemp(prefix=NAME + "-")
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _map(fd: int, size: int) -> mmap.mmap:
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)


def _unmap(mapping: mmap.mmap) -> None:
    # Views may still export it (a receiver's live tensors): then GC unmaps it.
    with contextlib.suppress(BufferError):
        mapping.close()


class Segment:
    """One sender-side segment: descriptor, mapping, and whether it is in use."""

    __slots__ = ("fd", "id", "mapping", "pooled", "sent", "size")

    def __init__(self, seg_id: int, size: int, pooled: bool) -> None:
        self.id = seg_id
        self.size = size
        self.pooled = pooled  # False: one-off, forgotten on release
        self.fd = _anonymous_fd(size)
        self.mapping: mmap.mmap | None = None
        self.sent = False  # has the receiver got the descriptor?

    def fill(self, sources: Sequence[Source], offsets: Sequence[int]) -> None:
        """Copy ``sources`` in at ``offsets`` (may run in a worker thread)."""
        if self.mapping is None:
            self.mapping = _map(self.fd, self.size)
        view = memoryview(self.mapping)
        try:
            for source, offset in zip(sources, offsets, strict=True):
                source.copy_into(view[offset : offset + source.spec.nbytes])
        finally:
            view.release()

    def close(self) -> None:
        if self.mapping is not None:
            _unmap(self.mapping)
            self.mapping = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SegmentPool:
    """The sender's segments on one connection (not thread-safe: one event loop).

    Free segments are kept per (rounded) size and reused last-in first-out, so
    a steady stream of like-sized messages cycles through a few segments that
    are still in cache. ``acquire`` answers None when the budget is spent:
    the sender then waits for releases (backpressure) before falling back to
    a one-off segment, which is forgotten as soon as it is released.
    """

    def __init__(self, budget: int = POOL_BYTES) -> None:
        self.budget = budget
        self._next_id = 0
        self._bytes = 0  # pooled segments, free or busy
        self._free: dict[int, list[Segment]] = {}  # by size
        self._busy: dict[int, Segment] = {}
        self._forget: list[int] = []

    def acquire(self, nbytes: int) -> Segment | None:
        """A pooled segment of at least ``nbytes``, or None if the budget is spent."""
        size = _rounded(nbytes)
        stack = self._free.get(size)
        if stack:
            segment = stack.pop()
            if not stack:
                del self._free[size]
        else:
            while self._bytes + size > self.budget and self._free:
                other = next(iter(self._free))
                self._discard(self._free[other].pop())
                if not self._free[other]:
                    del self._free[other]
            if self._bytes + size > self.budget:
                return None
            segment = self._new(size, pooled=True)
        self._busy[segment.id] = segment
        return segment

    def one_off(self, nbytes: int) -> Segment:
        """A segment outside the budget, closed as soon as it is released."""
        segment = self._new(-(-nbytes // ALIGN) * ALIGN, pooled=False)
        self._busy[segment.id] = segment
        return segment

    def _new(self, size: int, pooled: bool) -> Segment:
        self._next_id += 1
        if pooled:
            self._bytes += size
        return Segment(self._next_id, size, pooled)

    def release(self, seg_id: int) -> None:
        """The receiver let go of ``seg_id`` (or it was never sent)."""
        segment = self._busy.pop(seg_id, None)
        if segment is None:
            return
        if segment.pooled:
            self._free.setdefault(segment.size, []).append(segment)
        else:
            self._discard(segment)

    def _discard(self, segment: Segment) -> None:
        if segment.pooled:
            self._bytes -= segment.size
        if segment.sent:
            self._forget.append(segment.id)
        segment.close()

    def take_forgotten(self) -> list[int]:
        """Ids the receiver should unmap; each is reported once."""
        ids, self._forget = self._forget, []
        return ids

    def close(self) -> None:
        for stack in self._free.values():
            for segment in stack:
                segment.close()
        for segment in self._busy.values():
            segment.close()
        self._free.clear()
        self._busy.clear()
        self._forget.clear()
        self._bytes = 0


_LEASE_TYPES: dict[int, type] = {}


def _lease_type(size: int) -> type:
    """A ctypes byte-array subclass of ``size`` bytes (subclasses take weakrefs)."""
    cls = _LEASE_TYPES.get(size)
    if cls is None:
        cls = _LEASE_TYPES[size] = type("SegmentLease", (ctypes.c_ubyte * size,), {})
    return cls


class SegmentTable:
    """The receiver's mappings on one connection, and its release notices."""

    def __init__(self, notify: Callable[[int], None]) -> None:
        self._maps: dict[int, mmap.mmap] = {}
        self._notify = notify

    def add(self, seg_id: int, fd: int, size: int) -> None:
        """Map a segment whose descriptor just arrived; the fd is closed here."""
        try:
            self._maps[seg_id] = _map(fd, size)
        finally:
            os.close(fd)

    def lease(self, seg_id: int, nbytes: int) -> Any:
        """A buffer over the first ``nbytes`` of the segment; when it (and every
        view of it) dies, the sender is told it may reuse the segment."""
        lease = _lease_type(nbytes).from_buffer(self._maps[seg_id])
        weakref.finalize(lease, self._notify, seg_id)
        return lease

    def forget(self, ids: Sequence[int]) -> None:
        for seg_id in ids:
            mapping = self._maps.pop(seg_id, None)
            if mapping is not None:
                _unmap(mapping)

    def close(self) -> None:
        self.forget(list(self._maps))


class ReleaseWriter:
    """Writes release notices back to the sender, from any thread.

    A lease may die in any thread (whoever drops the last tensor), so notices
    are queued under a lock and written without blocking; what does not fit
    now goes out with the next notice or the next ``flush``.
    """

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._pending = bytearray()
        self._lock = threading.Lock()
        self._closed = False

    def __call__(self, seg_id: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._pending += RELEASE.pack(seg_id)
            self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            if self._pending and not self._closed:
                self._flush_locked()

    def _flush_locked(self) -> None:
        try:
            sent = self._sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the sender is gone: nothing to tell
            self._pending.clear()
            return
        del self._pending[:sent]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._pending.clear()
