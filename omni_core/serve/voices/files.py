"""File operations below a directory descriptor that never follow a link or block.

The voices store keeps files a client uploaded; another local user, or a
mistake, may swap any of them for a link, a FIFO or a device between two
looks. Everything here works relative to an open directory (``dir_fd``),
opens with ``O_NOFOLLOW``, checks what it opened, and refuses the rest as
:class:`Skipped`, so no such swap can make the server read, write or delete
outside its directory, or hang at start-up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW


class Skipped(Exception):
    """An entry that is not what a voice is made of (a link, a FIFO, a device …)."""


def write_file(dir_fd: int, name: str, data: bytes) -> None:
    """Create ``name`` (0600, never through a link, never over a file) and flush it."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def open_entry(dir_fd: int, name: str) -> int:
    """A directory below ``dir_fd``; Skipped if it is a link or not a directory."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode):
        raise Skipped(f"{kind(info.st_mode)}, not a voice directory")
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped since the stat
            raise Skipped("not a voice directory (it changed while being read)") from None
        raise


def read_regular(dir_fd: int, name: str, limit: int) -> bytes:
    """The bytes of a regular file below ``dir_fd``; Skipped for anything else.

    Why stat, then open non-blocking, then fstat: a FIFO or a device must
    never be opened in a way that blocks start-up, and a file swapped
    between the two looks is caught by the second.
    """
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(info.st_mode):
        raise Skipped(f"{name} is {kind(info.st_mode)}, not a regular file")
    if info.st_size > limit:
        raise Skipped(f"{name} holds {info.st_size} bytes, over the {limit}-byte limit")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Skipped(f"{name} is a symbolic link, not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Skipped(f"{name} is not a regular file (it changed while being read)")
        data = read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Skipped(f"{name} is over the {limit}-byte limit")
    return data


def read_at_most(fd: int, count: int) -> bytes:
    chunks: list[bytes] = []
    while count > 0:
        chunk = os.read(fd, min(count, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def remove_tree(dir_fd: int, name: str) -> None:
    """Remove ``name`` below ``dir_fd`` and everything in it, never following a link.

    A link is unlinked (its target untouched); a directory is entered only
    through ``O_NOFOLLOW``, so one swapped for a link meanwhile fails instead
    of being followed. (``shutil.rmtree(dir_fd=)`` needs Python 3.11.)
    """
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        with os.scandir(fd) as entries:
            children = [entry.name for entry in entries]
        for child in children:
            remove_tree(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def lexists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def kind(mode: int) -> str:
    kinds = [
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((what for test, what in kinds if test(mode)), "not a file")


def fsync(fd: int) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot sync a directory
        os.fsync(fd)
