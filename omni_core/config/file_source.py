"""A deploy file: TOML text -> patches with ``file:line`` origins."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

import tomli

from ..errors import ConfigError, suggestion
from .coerce import coerce, describe
from .origin import Layer, Origin, Patch, Path, Rank, dotted
from .paths import PathError, PathSchema
from .toml_lines import key_lines, line_of, too_deep

SELECT_KEYS = ("stages", "engine", "exclude")
# Far beyond any real deploy file, far below where recursive code (tomli's
# parser, pydantic, deepcopy, rendering) would exhaust Python's stack.
MAX_DEPTH = 64


@dataclass
class DeployFile:
    """A parsed deploy file, with the line of every key."""

    label: str
    data: dict[str, Any]
    lines: dict[Path, int]

    @classmethod
    def read(cls, path: str | FsPath) -> DeployFile:
        label = str(path)
        try:
            text = FsPath(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"deploy file {label!r} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read deploy file {label!r}: {exc}") from None
        return cls.parse(text, label)

    @classmethod
    def parse(cls, text: str, label: str) -> DeployFile:
        line = too_deep(text, MAX_DEPTH)
        if line is not None:
            raise _too_deep(f"{label}:{line}", "arrays and inline tables")
        try:
            data = tomli.loads(text)
        except tomli.TOMLDecodeError as exc:
            raise ConfigError(_decode_message(exc), origin=_decode_origin(exc, label)) from None
        except RecursionError:  # the scan above should make this unreachable
            raise _too_deep(label, "values") from None
        lines = key_lines(text)
        path = _deeper_than(data, MAX_DEPTH)
        if path is not None:
            line = line_of(lines, path)
            raise _too_deep(f"{label}:{line}" if line else label, "keys and tables")
        return cls(label=label, data=data, lines=lines)

    def origin(self, path: Path, rank: Rank = Rank.EXPLICIT) -> Origin:
        line = line_of(self.lines, path)
        return Origin(f"{self.label}:{line}" if line else self.label, Layer.FILE, rank)


def _too_deep(origin: str, what: str) -> ConfigError:
    return ConfigError(
        f"{what} nest more than {MAX_DEPTH} levels deep",
        origin=origin,
        hint="no omni setting nests that deep; is this the deploy file you meant?",
    )


def _deeper_than(data: dict[str, Any], limit: int) -> Path | None:
    """The path of a value nested deeper than ``limit`` (dotted keys count), or None.

    Iterative, so that the check itself cannot exhaust the stack.
    """
    todo: list[tuple[Path, Any]] = [((), data)]
    while todo:
        path, value = todo.pop()
        if len(path) > limit:
            return path
        if isinstance(value, dict):
            todo.extend(((*path, str(k)), v) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend(((*path, str(i)), v) for i, v in enumerate(value))
    return None


def _decode_origin(exc: tomli.TOMLDecodeError, label: str) -> str:
    line, col = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    if line is None:
        match = re.search(r"line (\d+), column (\d+)", str(exc))
        line, col = (int(match.group(1)), int(match.group(2))) if match else (None, None)
    return f"{label}:{line}:{col}" if line else label


def _decode_message(exc: tomli.TOMLDecodeError) -> str:
    text = getattr(exc, "msg", None) or re.sub(r"\s*\(at .*\)$", "", str(exc))
    return f"invalid TOML: {text}"


class FileSource:
    """Turns one deploy file into patches against one pipeline's paths."""

    def __init__(self, deploy: DeployFile, schema: PathSchema, counter: list[int]):
        self.deploy, self.schema, self.counter = deploy, schema, counter
        self.patches: list[Patch] = []

    def collect(self) -> list[Patch]:
        for key, value in self.deploy.data.items():
            if key == "pipeline":
                continue
            if key == "shared":
                self._shared(value)
                continue
            self._walk((key,), value, (key,), self.deploy.origin((key,)))
        return self.patches

    def _walk(self, path: Path, value: Any, file_path: Path, origin: Origin) -> None:
        origin = origin if origin.rank == Rank.SHARED else self.deploy.origin(file_path)
        try:
            node = self.schema.node(path)
        except PathError as exc:
            raise PathError(exc.message, origin=str(origin), hint=exc.hint) from None
        if node.container:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{dotted(path)} is a group of settings, not a value",
                    origin=str(origin),
                    hint=f"write a table: [{dotted(path)}] with one key per setting",
                )
            for key, inner in value.items():
                self._walk((*path, key), inner, (*file_path, key), origin)
            return
        try:
            coerced = coerce(value, node.annotation, from_text=False)
        except ValueError as exc:
            raise ConfigError(
                f"{dotted(path)}: {exc}",
                origin=str(origin),
                hint=f"give {dotted(path)} {describe(node.annotation)}",
            ) from None
        self.counter[0] += 1
        self.patches.append(Patch(node.path, coerced, origin, self.counter[0]))

    def _shared(self, entries: Any) -> None:
        if not isinstance(entries, list):
            raise ConfigError(
                "shared must be an array of tables",
                origin=str(self.deploy.origin(("shared",))),
                hint="write each entry as [[shared]] with a select = {...} and the settings",
            )
        for index, entry in enumerate(entries):
            line = line_of(self.deploy.lines, ("shared", str(index)))
            origin = Origin(
                f"[[shared]] #{index + 1} ({self.deploy.label}:{line})", Layer.FILE, Rank.SHARED
            )
            for stage in self._select(entry, origin):
                for key, value in entry.items():
                    if key != "select":
                        self._walk(
                            ("stages", stage, key), value, ("shared", str(index), key), origin
                        )

    def _select(self, entry: Any, origin: Origin) -> list[str]:
        where = str(origin)
        if not isinstance(entry, dict):
            raise ConfigError("a [[shared]] entry must be a table", origin=where)
        select = entry.get("select", {})
        if not isinstance(select, dict):
            raise ConfigError(
                "select must be a table", origin=where, hint="select = { engine = true }"
            )
        for key in select:
            if key not in SELECT_KEYS:
                raise ConfigError(
                    f"unknown selector key {key!r}",
                    origin=where,
                    hint=suggestion(key, SELECT_KEYS, kind="selector keys"),
                )
        if not any(k != "select" for k in entry):
            raise ConfigError(
                "this [[shared]] entry has a selector but no settings to write",
                origin=where,
                hint="add the settings next to select, e.g. engine.max_running_requests = 16",
            )
        stages = self.schema.stages
        named = self._names(select, "stages", where)
        if named == []:
            raise ConfigError(
                "select.stages is empty, so this [[shared]] entry matches no stage",
                origin=where,
                hint="list the stages it is for, or leave out stages to select every stage",
            )
        chosen = list(stages) if named is None else named
        if "engine" in select:
            if not isinstance(select["engine"], bool):
                raise ConfigError("select.engine must be true or false", origin=where)
            chosen = [s for s in chosen if stages[s].is_engine == select["engine"]]
        excluded = self._names(select, "exclude", where) or []
        chosen = [s for s in chosen if s not in excluded]
        if not chosen:
            raise ConfigError(
                "this [[shared]] selector matches no stage",
                origin=where,
                hint=f"stages of this pipeline: {', '.join(stages)}",
            )
        return chosen

    def _names(self, select: dict, key: str, where: str) -> list[str] | None:
        if key not in select:
            return None
        names = select[key]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"select.{key} must be a list of stage names", origin=where)
        for name in names:
            if name not in self.schema.stages:
                raise ConfigError(
                    f"select.{key} names stage {name!r}, which does not exist",
                    origin=where,
                    hint=suggestion(name, self.schema.stages, kind="stages of this pipeline"),
                )
        return names
