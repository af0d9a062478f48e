"""The ``omni`` command line.

Each command group lives in its own module and registers itself on :data:`app`.
:func:`main` turns every :class:`~omni_core.errors.OmniError` into a message
on stderr and its exit code (2 for configuration and usage errors), so a user
never sees a traceback for a mistake of theirs.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer

from ..errors import OmniError

# Command name -> the module that registers it. Only the module a command
# needs is imported, so that `omni plugins list` does not pay for the server.
COMMANDS = {
    "plugins": "plugins_cmd",
    "config": "config_cmd",
    "plan": "plan_cmd",
    "serve": "serve_cmd",
    "run": "serve_cmd",
    "logs": "logs_cmd",
}


def load_commands(argv: list[str] | None = None) -> typer.Typer:
    """Import the command modules ``argv`` needs (all of them without a known command)."""
    from ._app import app

    first = next((a for a in argv or [] if not a.startswith("-")), None)
    modules = [COMMANDS[first]] if first in COMMANDS else sorted(set(COMMANDS.values()))
    for module in modules:
        importlib.import_module(f".{module}", __name__)
    return app


def __getattr__(name: str) -> Any:
    if name == "app":  # the whole application, for embedding and tests
        return load_commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``omni`` console script."""
    try:
        argv = sys.argv[1:] if argv is None else argv
        load_commands(argv)(args=argv, prog_name="omni", standalone_mode=False)
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
