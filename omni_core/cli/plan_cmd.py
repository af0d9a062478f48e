"""``omni plan DEPLOY [flags] [--format text|json|svg|html] [--output FILE]``: where every
stage will run, before anything starts.

Resolves the deployment like ``omni config resolve``, detects this machine's
GPUs (NVML; "unknown" without a driver) under the deploy file's ``[cluster]``
overrides (``--gpus N --gpu-memory 80GiB`` plan for other hardware), and
prints the plan as tables, as JSON (``--json`` is ``--format json``), or as a
picture of the stage graph (``svg``, or an ``html`` page around it:
:mod:`omni_core.plan.picture`). ``--output FILE`` writes it there instead,
atomically (a temporary file renamed over it), so a reader never sees half a
picture. No model is loaded; an infeasible deployment exits 2 with every reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from enum import Enum
from pathlib import Path

import typer

from ..errors import UsageError
from ..plan import inventory_for, plan_deployment
from ._app import app
from .deployment import deployment_command


class Format(str, Enum):
    text = "text"
    json = "json"
    svg = "svg"
    html = "html"


@deployment_command(app, "plan")
def plan_command(
    resolution,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (--format json)."),
    fmt: Format | None = typer.Option(
        None,
        "--format",
        help="text (tables, the default), json, svg (a picture of the stage graph) or html "
        "(a page with that picture).",
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Write the plan to FILE (atomically) instead of printing it.",
        dir_okay=False,
    ),
    detect: bool = typer.Option(
        True,
        "--detect/--no-detect",
        help="Detect this machine's GPUs through NVML (default), or plan against the "
        "deploy file's [cluster] alone.",
    ),
) -> None:
    """Plan DEPLOY: placement, processes, replicas, weight sharing, MPS and endpoints."""
    if as_json and fmt not in (None, Format.json):
        raise UsageError(
            f"--json and --format {fmt.value} ask for two formats", hint="give one of them"
        )
    fmt = Format.json if as_json else fmt or Format.text
    config = resolution.config
    inventory = inventory_for(config, detect=detect)
    plan = plan_deployment(config, inventory)
    if fmt is Format.json:
        text = json.dumps(plan.to_dict(), indent=2) + "\n"
    elif fmt in (Format.svg, Format.html):
        from ..plan.picture import plan_html, plan_svg

        text = plan_svg(plan) if fmt is Format.svg else plan_html(plan)
    else:
        from ..plan.render import render_plan

        if output is None:
            render_plan(plan)
            return
        import io

        buffer = io.StringIO()
        render_plan(plan, file=buffer)
        text = buffer.getvalue()
    if output is None:
        typer.echo(text, nl=False)
    else:
        write_atomically(output, text)


def write_atomically(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file in the same directory, renamed over it.

    A reader (a browser reloading the picture, a CI step) sees the old file or
    the new one, never a half-written one. An unwritable place is a usage
    error naming the path, not a traceback.
    """
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, _mode_for(path))  # mkstemp's 0600, as a plain write would not make it
        os.replace(temp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def _mode_for(path: Path) -> int:
    """The mode ``path`` has, or the one a new file gets under the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
