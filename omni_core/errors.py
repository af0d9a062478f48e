"""Errors a user can act on.

Every error that reaches the command line is an :class:`OmniError`: it carries
the message, where the bad value came from, and how to fix it, and the CLI
prints those three without a traceback. Anything else escaping the CLI is a bug.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class OmniError(Exception):
    """An error with a message meant for the person running ``omni``."""

    exit_code = 1

    def __init__(self, message: str, *, origin: str | None = None, hint: str | None = None):
        self.message = message
        self.origin = origin
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.origin}: {self.message}" if self.origin else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ConfigError(OmniError):
    """The deployment (file, flags or pipeline declaration) is wrong: exit 2."""

    exit_code = 2


class UsageError(OmniError):
    """The command line itself is wrong: exit 2."""

    exit_code = 2


class PluginError(ConfigError):
    """A plugin is missing, broken, or clashes with another plugin: exit 2."""


class NotImplementedYet(OmniError):
    """A declared capability whose implementation has not landed.

    Raised instead of pretending: a stage factory whose model code does not
    exist yet says so at construction, naming what is missing.
    """


class RequestError(OmniError):
    """A request is invalid (empty text, unknown voice, unreadable audio): HTTP 400.

    Stages raise it for bad input; the runtime reports it as the client's
    error, not the server's.
    """

    exit_code = 2


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The closest of ``choices`` to ``word``, difflib-style, or None."""
    matches = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return matches[0] if matches else None


def suggestion(word: str, choices: Iterable[str], *, kind: str) -> str:
    """A "real names are …; did you mean …" tail for unknown-name messages."""
    choices = sorted(set(choices))
    text = f"{kind}: {', '.join(choices) if choices else '(none)'}"
    close = did_you_mean(word, choices)
    if close:
        text += f"; did you mean: {close}"
    return text
