"""Line numbers for the keys of a TOML document.

tomli parses values but forgets where they were written. This scanner walks
the text once and records, for every key path, the line that wrote it, so
that errors and provenance can say ``deploy.toml:7``. Values inside inline
tables and multi-line arrays map to the line of their key (lookup walks up).
"""

from __future__ import annotations

from .origin import Path


def _split_key(text: str) -> list[str]:
    """Split a dotted TOML key, honouring quotes."""
    parts, current, quote = [], "", ""
    for char in text:
        if quote:
            if char == quote:
                quote = ""
            else:
                current += char
        elif char in "\"'":
            quote = char
        elif char == ".":
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts


def _key_of(line: str) -> str | None:
    """The key of a ``key = value`` line, or None."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "=":
            return line[:index].strip()
        elif char == "#":
            return None
    return None


class _Depth:
    """Tracks strings and brackets that continue over several lines."""

    def __init__(self) -> None:
        self.brackets = 0
        self.deepest = 0
        self.multiline: str | None = None

    @property
    def inside(self) -> bool:
        return self.brackets > 0 or self.multiline is not None

    def feed(self, line: str) -> None:
        index, quote = 0, ""
        while index < len(line):
            if self.multiline:
                end = line.find(self.multiline, index)
                if end < 0:
                    return
                index, self.multiline = end + 3, None
                continue
            chunk = line[index : index + 3]
            char = line[index]
            if quote:
                if char == "\\" and quote == '"':
                    index += 1
                elif char == quote:
                    quote = ""
            elif chunk in ('"""', "'''"):
                self.multiline = chunk
                index += 3
                continue
            elif char in "\"'":
                quote = char
            elif char == "#":
                return
            elif char in "[{":
                self.brackets += 1
                self.deepest = max(self.deepest, self.brackets)
            elif char in "]}":
                self.brackets -= 1
            index += 1


def key_lines(text: str) -> dict[Path, int]:
    """Map each key path (and each array-of-tables entry) to its 1-based line."""
    lines: dict[Path, int] = {}
    table: Path = ()
    array_counts: dict[Path, int] = {}
    depth = _Depth()
    for number, raw in enumerate(text.splitlines(), start=1):
        if depth.inside:
            depth.feed(raw)
            continue
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[["):
            name = tuple(_split_key(line[2 : line.index("]]")]))
            index = array_counts.get(name, 0)
            array_counts[name] = index + 1
            table = (*name, str(index))
            lines[table] = number
            continue
        if line.startswith("["):
            table = tuple(_split_key(line[1 : line.index("]")]))
            lines.setdefault(table, number)
            continue
        key = _key_of(line)
        if key is not None:
            lines[(*table, *_split_key(key))] = number
            depth.feed(raw[raw.index("=") + 1 :])
    return lines


def too_deep(text: str, limit: int) -> int | None:
    """The first line where arrays and inline tables nest deeper than ``limit``, or None.

    A scan, not a parse: tomli parses nesting by recursion, so text thousands
    of brackets deep would exhaust Python's stack before it could be refused.
    """
    depth = _Depth()
    for number, line in enumerate(text.splitlines(), start=1):
        depth.feed(line)
        if depth.deepest > limit:
            return number
    return None


def line_of(lines: dict[Path, int], path: Path) -> int | None:
    """The line that wrote ``path``: its key, else its first inner key, else its table."""
    if path in lines:
        return lines[path]
    inner = [line for key, line in lines.items() if key[: len(path)] == path]
    if inner:
        return min(inner)
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return None
