"""The runtime directory: private to this user, never reached through a link.

Why so strict: the deployment's sockets, GPU locks and MPS pipes live
here, and its path is predictable (``omni plan --json`` prints it). Another
local user who could create the directory first, or plant a symbolic link
where it will be, would get our sockets or make us write through the link.
So on every start the base directory and the deployment's directory are
checked with ``lstat`` (a link is seen as a link, never followed): each must
be a real directory, owned by us, with no access for group or others. What
fails is refused with the path and the fix, before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat

from ..errors import ConfigError
from .pids import running

PRIVATE_MODE = 0o700
_OPEN_FLAGS = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def prepare(base: str, path: str) -> None:
    """Make ``path`` (under ``base``) a fresh private directory, or raise ConfigError.

    A directory a killed runtime left behind is ours and is replaced; one
    whose ``owner.pid`` names a live process is another runtime's and is
    refused.
    """
    parent = os.path.dirname(base.rstrip("/")) or "/"
    os.makedirs(parent, mode=PRIVATE_MODE, exist_ok=True)
    _make(base)
    check_private(base, "the runtime base directory (endpoints.base_path)")
    if lexists(path):
        check_private(path, "the deployment's runtime directory")
        _refuse_if_live(path)
        shutil.rmtree(path)
    _make(path)
    check_private(path, "the deployment's runtime directory")
    write_private(os.path.join(path, "owner.pid"), str(os.getpid()))


def check_private(path: str, what: str, setting: str = "endpoints.base_path") -> None:
    """ConfigError unless ``path`` is a real directory of ours that only we can use.

    ``setting`` is the one the fix suggests changing instead.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    fix = f"remove it (rm -r {path}) or choose another {setting}"
    if stat.S_ISLNK(info.st_mode):
        raise ConfigError(
            f"{what} {path} is a symbolic link (to {os.readlink(path)}); omni never "
            "follows links for its runtime files or logs",
            hint=fix,
        )
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{what} {path} exists and is not a directory", hint=fix)
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"{what} {path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); "
            "its owner could read and replace the deployment's files",
            hint=fix,
        )
    if info.st_mode & 0o077:
        raise ConfigError(
            f"{what} {path} has mode {stat.S_IMODE(info.st_mode):04o}; group and others "
            "must have no access to it",
            hint=f"chmod 700 {path}, or choose another {setting}",
        )


def write_private(path: str, text: str) -> None:
    """Create ``path`` (mode 0600) and write ``text``; refuse a link or an existing file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def open_private(path: str, flags: int) -> int:
    """``os.open`` that never follows a link and creates files 0600."""
    return os.open(path, flags | _OPEN_FLAGS, 0o600)


def _make(path: str) -> None:
    with contextlib.suppress(FileExistsError):  # checked by the caller, link or not
        os.mkdir(path, PRIVATE_MODE)


def lexists(path: str) -> bool:
    """Whether anything, a dangling link included, is at ``path`` (never followed)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _refuse_if_live(path: str) -> None:
    try:
        fd = open_private(os.path.join(path, "owner.pid"), os.O_RDONLY)
        with os.fdopen(fd) as handle:
            pid = int(handle.read().strip() or 0)
    except (OSError, ValueError):
        return
    if pid and running(pid):
        raise ConfigError(
            f"another omni runtime (pid {pid}) is serving this deployment from {path}",
            hint="stop it first, or set endpoints.base_path to another directory",
        )
