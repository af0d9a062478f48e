"""The ``omni`` command line.

Each command group lives in its own module and registers itself on :data:`app`.
:func:`main` turns every :class:`~omni_core.errors.OmniError` into a message
on stderr and its exit code (2 for configuration and usage errors), so a user
never sees a traceback for a mistake of theirs.
"""

from __future__ import annotations

import sys

import typer

from ..errors import OmniError

app = typer.Typer(
    name="omni",
    help="Serve multi-stage omni-modal model pipelines (Qwen3-Omni, Qwen3-TTS, MOSS-TTS).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

from . import config_cmd, plugins_cmd  # noqa: E402  (each registers its commands on app)

__all__ = ["app", "config_cmd", "main", "plugins_cmd"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``omni`` console script."""
    try:
        app(args=argv, prog_name="omni", standalone_mode=False)
    except OmniError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except _CLICK_ERROR as exc:  # usage errors found by the argument parser
        exc.show()
        return exc.exit_code
    return 0


# typer either uses click or vendors it; its usage errors derive from ClickException.
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
