"""The typer application every command module registers itself on."""

import typer

app = typer.Typer(
    name="omni",
    help="Serve multi-stage omni-modal model pipelines (Qwen3-Omni, Qwen3-TTS, MOSS-TTS).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    """omni-core's version and every installed plugin distribution's, then exit."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    from ..plugins import get_plugins

    try:
        core = version("omni-core")
    except PackageNotFoundError:  # a source tree that is not installed
        core = "unknown"
    typer.echo(f"omni-core {core}")
    for row in get_plugins().listing():  # installed plugins only, not the built-in ones
        typer.echo(f"{row['name']} {row['version'] or 'unknown'}")
    raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print omni-core's version and every installed plugin's, then exit.",
    ),
) -> None:
    """Serve multi-stage omni-modal model pipelines (Qwen3-Omni, Qwen3-TTS, MOSS-TTS).

    Start with `omni plugins list`, then `omni plan DEPLOY` and `omni serve DEPLOY`.
    """
    # A callback keeps `omni` a command group even when only one command module
    # is loaded (typer would otherwise collapse a single command into the root).
