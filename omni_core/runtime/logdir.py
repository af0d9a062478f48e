"""Where a deployment's process logs go, and why they outlive it.

Each run of a deployment (``omni serve``, ``omni run``, a test's runtime)
writes its processes' output (stdout, stderr, a failed request's traceback)
to ``<runtime.log_dir>/<deployment id>-<start time>/<process>.log``. The
runtime directory is removed at stop; this directory is not, so the logs of a
run that failed or was stopped can still be read (``omni logs DEPLOY``).

``runtime.log_dir`` defaults to ``$XDG_STATE_HOME/omni/logs``, else
``~/.local/state/omni/logs``. It holds what a stage printed, which may be
private, so it gets the runtime directory's checks (:mod:`.rundir`): a real
directory of ours, mode 0700, never a link. The last :data:`KEEP_RUNS` runs of
each deployment are kept; older ones are removed when a new run starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import time

from .rundir import PRIVATE_MODE, check_private, lexists

KEEP_RUNS = 10
"""Runs of one deployment whose logs are kept; a new run removes the older ones."""

WHAT = "the log directory (runtime.log_dir)"
SETTING = "runtime.log_dir (--log-dir)"
_STAMP = re.compile(r"(\d{8}T\d{6})(?:-(\d+))?")


def default_log_base() -> str:
    """``$XDG_STATE_HOME/omni/logs``, else ``~/.local/state/omni/logs``."""
    state = os.environ.get("XDG_STATE_HOME", "")
    if not (state and os.path.isabs(state)):
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "omni", "logs")


def log_base(configured: str | None) -> str:
    """The directory ``runtime.log_dir`` names (``~`` expanded, made absolute), or the default."""
    if not configured:
        return default_log_base()
    return os.path.abspath(os.path.expanduser(configured))


def new_run_dir(base: str, deployment_id: str, now: float | None = None) -> str:
    """The path of a new run's directory (nothing is created; see :func:`prepare`)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(time.time() if now is None else now))
    path, n = os.path.join(base, f"{deployment_id}-{stamp}"), 1
    while lexists(path):
        n += 1
        path = os.path.join(base, f"{deployment_id}-{stamp}-{n}")
    return path


def prepare(run_dir: str, deployment_id: str, keep: int = KEEP_RUNS) -> None:
    """Create ``run_dir`` (0700) under a checked private base; drop runs past ``keep``.

    ConfigError (naming the path and the fix) if the base is a link, not a
    directory, another user's, or open to group or others.
    """
    base = os.path.dirname(run_dir)
    os.makedirs(os.path.dirname(base), mode=PRIVATE_MODE, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # checked below, link or not
        os.mkdir(base, PRIVATE_MODE)
    check_private(base, WHAT, SETTING)
    os.mkdir(run_dir, PRIVATE_MODE)
    check_private(run_dir, "the run's log directory", SETTING)
    for old in runs(base, deployment_id)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def runs(base: str, deployment_id: str) -> list[str]:
    """The run directories of ``deployment_id`` under ``base``, oldest first (links skipped)."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    found = []
    prefix = f"{deployment_id}-"
    for name in names:
        match = _STAMP.fullmatch(name[len(prefix) :]) if name.startswith(prefix) else None
        if match is None:
            continue
        path = os.path.join(base, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            found.append(((match.group(1), int(match.group(2) or 1)), path))
    return [path for _, path in sorted(found)]


def last_run(base: str, deployment_id: str) -> str | None:
    """The newest run directory of ``deployment_id``, or None."""
    found = runs(base, deployment_id)
    return found[-1] if found else None
