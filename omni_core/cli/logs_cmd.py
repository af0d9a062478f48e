"""``omni logs DEPLOY [PROCESS] [flags]``: the process logs of a deployment's last run.

DEPLOY and its settings flags resolve as in ``omni plan`` (give the ones
``omni serve`` was given: the deployment id is a digest of the resolved
settings), which names the run directories under ``runtime.log_dir`` (see
:mod:`omni_core.runtime.logdir`); the newest one's logs are printed, each
after a ``==> path <==`` line, or only PROCESS's. ``--paths`` prints the
paths alone. Nothing is started, no model is loaded.
"""

from __future__ import annotations

import os
import sys

import typer

from ..errors import OmniError, UsageError
from ._app import app
from .deployment import ARGS_HELP, CONTEXT, split_positionals


@app.command("logs", context_settings=CONTEXT)
def logs_command(
    args: list[str] | None = typer.Argument(
        None, metavar="DEPLOY [PROCESS] [--PATH VALUE]...", help=ARGS_HELP
    ),
    pipeline: str | None = typer.Option(
        None, "--pipeline", help="Pipeline name (or alias); outranks the deploy file's `pipeline`."
    ),
    paths: bool = typer.Option(False, "--paths", help="Print the log files' paths only."),
) -> None:
    """Print the process logs of DEPLOY's last run (kept under runtime.log_dir after stop)."""
    from ..config import load_deployment
    from ..plan.endpoints import deployment_id
    from ..runtime import logdir

    positionals, flags = split_positionals(list(args or []), 2)
    deploy, process = _split(positionals, pipeline)
    resolution = load_deployment(deploy, flags, pipeline=pipeline)
    ident = deployment_id(resolution.config)
    base = logdir.log_base(resolution.config.runtime.log_dir)
    run = logdir.last_run(base, ident)
    if run is None:
        raise OmniError(f"no logs of deployment {ident} under {base}", hint=_hint(base, ident))
    files = sorted(name for name in os.listdir(run) if name.endswith(".log"))
    if process is not None:
        if f"{process}.log" not in files:
            known = ", ".join(name[: -len(".log")] for name in files) or "none"
            raise UsageError(
                f"no log of process {process!r} in {run}", hint=f"the processes are: {known}"
            )
        files = [f"{process}.log"]
    for name in files:
        path = os.path.join(run, name)
        if paths:
            print(path)
            continue
        print(f"==> {path} <==", flush=True)
        with open(path, "rb") as handle:
            sys.stdout.buffer.write(handle.read())
        sys.stdout.buffer.flush()


def _split(positionals: list[str], pipeline: str | None) -> tuple[str | None, str | None]:
    """(DEPLOY, PROCESS); with ``--pipeline`` a lone positional is a deploy file only if one."""
    if pipeline is not None and len(positionals) == 1 and not _is_file(positionals[0]):
        return None, positionals[0]
    deploy = positionals[0] if positionals else None
    return deploy, positionals[1] if len(positionals) > 1 else None


def _is_file(token: str) -> bool:
    return token.endswith(".toml") or os.path.isfile(token)


def _hint(base: str, ident: str) -> str:
    from ..runtime import logdir

    pipeline = ident.rsplit("-", 1)[0]
    others = sorted(
        {
            name.rsplit("-", 1)[0]
            for name in (os.listdir(base) if os.path.isdir(base) else [])
            if name.startswith(f"{pipeline}-")
        }
    )
    others = [o for o in others if logdir.runs(base, o)]
    if others:
        return (
            "give the deploy file and settings flags omni serve was given (they make the "
            f"deployment id); runs of {pipeline} there: {', '.join(others)}"
        )
    return "has it been served with these settings, and with this runtime.log_dir (--log-dir)?"
