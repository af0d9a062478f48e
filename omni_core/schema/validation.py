"""Turn pydantic's ValidationError into lines a serving engineer can act on.

This is the one formatter: the config resolver (what ``omni`` prints) adds the
origin of each offending value to these lines, and the schema tests read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from .problems import SchemaProblems

Path = tuple[str, ...]


@dataclass(frozen=True)
class Problem:
    """One line of a refusal and the paths whose values caused it."""

    text: str
    paths: tuple[Path, ...]
    fix: str = ""


def _location(loc: Sequence[object], stage_names: Sequence[str]) -> Path:
    parts: list[str] = []
    for index, part in enumerate(loc):
        if isinstance(part, str) and part.startswith("function-"):
            continue  # pydantic's internal validator names
        if isinstance(part, int) and index > 0 and loc[index - 1] == "stages":
            parts.append(stage_names[part] if part < len(stage_names) else str(part))
        else:
            parts.append(str(part))
    return tuple(parts)


def validation_problems(
    exc: ValidationError, stage_names: Sequence[str] = (), prefix: Path = ()
) -> list[Problem]:
    """One problem per line, without pydantic's URLs; ``prefix`` locates the validated model."""
    problems: list[Problem] = []
    for error in exc.errors():
        base = (*prefix, *_location(error["loc"], stage_names))
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, SchemaProblems):
            for fields, message in cause.problems:
                if base and not message.startswith("stage "):
                    message = f"{'.'.join(base)}: {message}"
                problems.append(Problem(message, tuple((*base, f) for f in fields), _fix(message)))
            continue
        message = plain_bound(error) or str(error["msg"]).removeprefix("Value error, ")
        if base and not message.startswith("stage "):
            message = f"{'.'.join(base)}: {message}"
        problems.append(Problem(message, (base,), bound_fix(error) or _fix(message)))
    return problems


def _fix(message: str) -> str:
    """The generic remedy for a message that states its own rule."""
    if "is not a setting" in message or "has no field" in message:
        return "remove it, or correct its name"
    if "must be" in message:  # others ("exclusive: declare … one way") say their remedy
        return "set a value that meets this rule, or remove it to get the default"
    return ""


# pydantic's error type -> (operator, the ctx key holding the limit)
_BOUNDS = {
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}


def plain_bound(error: dict) -> str | None:
    """A bound declared with ``Field(ge=1)`` said as a serving engineer would say it."""
    kind = error.get("type", "")
    if kind in _BOUNDS:
        operator, key = _BOUNDS[kind]
        limit = (error.get("ctx") or {}).get(key)
        return f"must be {operator} {limit}, got {error.get('input')!r}"
    return None


def bound_fix(error: dict) -> str | None:
    """The remedy for a ``Field(ge=1)``-style bound: the values allowed."""
    kind = error.get("type", "")
    if kind in _BOUNDS:
        operator, key = _BOUNDS[kind]
        return f"write a value {operator} {(error.get('ctx') or {}).get(key)}"
    return None


def validation_message(exc: ValidationError, stage_names: Sequence[str] = ()) -> str:
    """The lines of :func:`validation_problems`, one per problem."""
    return "\n".join(problem.text for problem in validation_problems(exc, stage_names))
