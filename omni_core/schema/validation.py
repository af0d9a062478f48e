"""Turn pydantic's ValidationError into lines a serving engineer can act on."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError


def _dotted(loc: Sequence[object], stage_names: Sequence[str]) -> str:
    parts: list[str] = []
    for index, part in enumerate(loc):
        if isinstance(part, int) and index > 0 and loc[index - 1] == "stages":
            parts.append(stage_names[part] if part < len(stage_names) else str(part))
        elif isinstance(part, str) and part.startswith("function-"):
            continue  # pydantic's internal validator names
        else:
            parts.append(str(part))
    return ".".join(parts)


def validation_message(exc: ValidationError, stage_names: Sequence[str] = ()) -> str:
    """One line per problem: ``path: message``, without pydantic's URLs."""
    lines = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        path = _dotted(error["loc"], stage_names)
        lines.append(f"{path}: {message}" if path else message)
    return "\n".join(lines)
