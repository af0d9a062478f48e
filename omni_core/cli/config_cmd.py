"""``omni config resolve`` and ``omni config explain``: what is in effect, and why."""

from enum import Enum
from typing import Any

import typer

from ..config import load_deployment
from ..config.render import config_json, config_toml, diff_lines, explain, provenance_blocks
from ..errors import UsageError
from ._app import app
from .deployment import ARGS_HELP, CONTEXT, deployment_command, split_positionals

config_app = typer.Typer(
    help="Resolve a deployment and explain where each value came from (loads no model).",
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")


class Show(str, Enum):
    config = "config"
    diff = "diff"
    provenance = "provenance"


class Against(str, Enum):
    defaults = "defaults"
    file = "file"


class Format(str, Enum):
    toml = "toml"
    json = "json"


@deployment_command(config_app, "resolve")
def resolve_command(
    resolution,
    show: Show = typer.Option(
        Show.config,
        "--show",
        help="config (the whole result), diff (what differs from the baseline of "
        "--against) or provenance (every value's writes and winner).",
    ),
    fmt: Format = typer.Option(Format.toml, "--format", help="toml or json (for --show config)."),
    against: Against = typer.Option(
        Against.defaults,
        "--against",
        help="The baseline of --show diff: defaults (the model's; what the deploy file and "
        "flags changed) or file (the deploy file over the defaults; what the flags changed).",
    ),
) -> None:
    """Resolve DEPLOY and the flags: model defaults < deploy file < command line."""
    if show is Show.config:
        typer.echo(config_toml(resolution) if fmt is Format.toml else config_json(resolution))
    elif show is Show.diff:
        typer.echo("\n".join(diff_lines(resolution, against.value)))
    else:
        blocks = provenance_blocks(resolution)
        typer.echo("\n\n".join(blocks) if blocks else "no source wrote any value")


@config_app.command("explain", context_settings=CONTEXT)
def explain_command(
    args: list[str] | None = typer.Argument(
        None,
        metavar="DEPLOY PATH [--PATH VALUE]...",
        help="The deploy file, the path to "
        "explain (flag spelling tts_engine.engine.mem_fraction_static or stages.…), then "
        + ARGS_HELP.split(", then ", 1)[-1],
    ),
    pipeline: str | None = typer.Option(None, "--pipeline", help="Pipeline name (or alias)."),
) -> None:
    """Explain one setting: its default, every write to it, and which one won."""
    positionals, flags = split_positionals(list(args or []), 2)
    if len(positionals) == 2:
        deploy, path = positionals
    elif len(positionals) == 1 and pipeline:
        deploy, path = None, positionals[0]
    else:
        raise UsageError(
            "explain needs a deploy file and a path",
            hint="omni config explain deploy.toml tts_engine.engine.mem_fraction_static",
        )
    resolution = load_deployment(deploy, flags, pipeline=pipeline)
    record = resolution.record(resolution.schema.from_any(path))
    typer.echo(explain(record))
    reader = _engine_reader(resolution, record.path)
    if reader:
        typer.echo(f"  {reader}")


def _engine_reader(resolution: Any, path: tuple[str, ...]) -> str | None:
    """For ``stages.X.engine.KEY``: how the stage's engine backend reads KEY."""
    if len(path) != 4 or path[0] != "stages" or path[2] != "engine":
        return None
    stage = next((s for s in resolution.config.stages if s.name == path[1]), None)
    engine = getattr(stage, "engine", None)
    if engine is None:
        return None
    backend = (engine.model_dump(exclude_none=True).get("backend")) or "torch"
    if backend == "sglang":
        from ..engine.sglang_settings import describe_key

        return f"engine backend sglang: {describe_key(path[3])}"
    from ..engine.backends import get_backend

    known = get_backend(str(backend)).accepted_keys()
    state = "reads" if path[3] in known else "does not accept"
    return f"engine backend {backend} {state} engine.{path[3]}"
