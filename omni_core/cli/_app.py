"""The typer application every command module registers itself on."""

import typer

app = typer.Typer(
    name="omni",
    help="Serve multi-stage omni-modal model pipelines (Qwen3-Omni, Qwen3-TTS, MOSS-TTS).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """Serve multi-stage omni-modal model pipelines (Qwen3-Omni, Qwen3-TTS, MOSS-TTS).

    Start with `omni plugins list`, then `omni plan DEPLOY` and `omni serve DEPLOY`.
    """
    # A callback keeps `omni` a command group even when only one command module
    # is loaded (typer would otherwise collapse a single command into the root).
