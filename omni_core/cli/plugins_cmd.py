"""``omni plugins list``: what is installed, what it registers, what is broken."""

from __future__ import annotations

import json

import typer

from ..plugins import ENV_VAR, get_plugins
from ._app import app

plugins_app = typer.Typer(help="Inspect installed plugins.", no_args_is_help=True)
app.add_typer(plugins_app, name="plugins")


@plugins_app.command("list")
def list_plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    show_all: bool = typer.Option(False, "--all", help="Include the built-in plugins."),
) -> None:
    """List plugins: version, hooks, pipelines, placement policies, transports, launchers,
    errors."""
    plugins = get_plugins()
    rows = plugins.listing(include_builtin=show_all)
    if as_json:
        payload = {"plugins": rows, "unknown_requested": plugins.unknown_requested}
        typer.echo(json.dumps(payload, indent=2))
        return
    _print_table(rows)
    if plugins.unknown_requested:
        typer.echo(
            f"warning: {ENV_VAR} names plugins that are not installed: "
            + ", ".join(plugins.unknown_requested),
            err=True,
        )


def _print_table(rows: list[dict]) -> None:
    import shutil
    import sys

    from ..text_table import box_table

    if not rows:
        typer.echo("no plugins installed (pip install omni-qwen3-tts, for example)")
        return
    columns = ("plugin", "version", "hooks", "pipelines", "policies", "transports", "launchers")
    cells = [
        [
            row["name"],
            row["version"] or "",
            "\n".join(h.removeprefix("omni_") for h in row["hooks"]),
            "\n".join(row["pipelines"]),
            "\n".join(row["placement_policies"]),
            "\n".join(row["transports"]),
            "\n".join(row.get("launchers", [])),
            row["error"] or "",
        ]
        for row in rows
    ]
    # A terminal's own width; piped, wide enough that an error message stays on few lines.
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 200
    typer.echo("omni plugins")
    typer.echo(box_table((*columns, "error"), cells, width))
