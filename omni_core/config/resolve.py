"""Resolve: model defaults < deploy file < command line, with provenance.

Patches from every source are grouped by path. Inside one path the highest
precedence wins (layer, then broadcast < shared < explicit); two writes at
the same precedence with different values are refused, naming both origins.
The winners are applied onto the pipeline's defaults and the result is
validated by the schema; a validation error names the path and the origin
that wrote the offending value.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigError
from ..schema import PipelineConfig, StageConfig
from ..schema.validation import validation_problems
from .origin import Patch, Path, dotted
from .paths import TOP_GROUPS, TOP_LEAVES, PathSchema

MISSING = object()


def read_path(config: PipelineConfig, path: Path) -> Any:
    """The value at a canonical path, or MISSING if the path holds nothing."""
    head = path[0]
    if head == "stages":
        stage = config.stage(path[1])
        if len(path) == 3:
            return getattr(stage, path[2])
        container = getattr(stage, path[2])
        if isinstance(container, dict):
            return container.get(path[3], MISSING)
        if path[3] in type(container).model_fields:
            return getattr(container, path[3])
        return (container.model_extra or {}).get(path[3], MISSING)
    if head == "processes":
        return getattr(config.process_config(path[1]), path[2])
    value: Any = config
    for part in path:
        value = getattr(value, part)
    return value


@dataclass
class PathRecord:
    """The provenance of one path: its default and every write to it."""

    path: Path
    default: Any
    writes: list[Patch] = field(default_factory=list)
    final: Any = MISSING

    @property
    def winner(self) -> Patch | None:
        return self.writes[-1] if self.writes else None


@dataclass
class Resolution:
    """A resolved deployment: the validated config and where every value came from."""

    pipeline_cls: type[PipelineConfig]
    config: PipelineConfig
    defaults: PipelineConfig
    schema: PathSchema
    records: dict[Path, PathRecord]
    deploy_file: str | None = None

    def record(self, path: Path) -> PathRecord:
        if path in self.records:
            return self.records[path]
        self.schema.node(path)  # raises for a path that does not exist
        default = read_path(self.defaults, path)
        return PathRecord(path, default, final=read_path(self.config, path))


def resolve(
    pipeline_cls: type[PipelineConfig],
    patches: list[Patch],
    *,
    schema: PathSchema,
    deploy_file: str | None = None,
) -> Resolution:
    defaults = schema.defaults
    by_path: dict[Path, list[Patch]] = defaultdict(list)
    for patch in sorted(patches, key=lambda p: p.precedence):
        by_path[patch.path].append(patch)
    records: dict[Path, PathRecord] = {}
    for path, writes in by_path.items():
        _refuse_conflicts(path, writes)
        records[path] = PathRecord(path, read_path(defaults, path), writes)
    winners = {path: record.winner for path, record in records.items()}
    config = _build(pipeline_cls, defaults, winners)
    for record in records.values():
        record.final = read_path(config, record.path)
    return Resolution(pipeline_cls, config, defaults, schema, records, deploy_file)


def _refuse_conflicts(path: Path, writes: list[Patch]) -> None:
    for before, after in pairwise(writes):
        same_level = (
            before.origin.layer == after.origin.layer and before.origin.rank == after.origin.rank
        )
        if same_level and before.value != after.value:
            raise ConfigError(
                f"{dotted(path)} is written twice with different values at the same precedence: "
                f"{before.value!r} by {before.origin} and {after.value!r} by {after.origin}",
                hint="keep one of them; writes never silently override each other",
            )


def _build(
    pipeline_cls: type[PipelineConfig], defaults: PipelineConfig, winners: dict[Path, Patch]
) -> PipelineConfig:
    top: dict[str, Any] = {
        **{name: getattr(defaults, name) for name in TOP_LEAVES},
        **{name: getattr(defaults, name).model_dump() for name in TOP_GROUPS},
        "processes": {name: p.model_dump() for name, p in defaults.processes.items()},
    }
    stage_updates: dict[str, dict[str, Any]] = defaultdict(dict)
    for path, patch in winners.items():
        if path[0] == "stages":
            target = stage_updates[path[1]]
            if len(path) == 4:
                target = target.setdefault(path[2], {})
            target[path[-1]] = patch.value
        elif path[0] == "processes":
            top["processes"].setdefault(path[1], {})[path[2]] = patch.value
        elif len(path) == 2:
            top[path[0]][path[1]] = patch.value
        else:
            top[path[0]] = patch.value
    stages = [
        _build_stage(stage, stage_updates.get(stage.name), winners) for stage in defaults.stages
    ]
    try:
        return pipeline_cls.model_validate({**top, "stages": stages})
    except ValidationError as exc:
        raise _explained(exc, (), winners, [s.name for s in stages]) from None


def _build_stage(
    default: StageConfig, updates: dict[str, Any] | None, winners: dict[Path, Patch]
) -> StageConfig:
    if not updates:
        return default
    prefix: Path = ("stages", default.name)
    data = {name: getattr(default, name) for name in default.model_fields_set}
    for name, value in updates.items():
        if name in ("factory", "engine"):
            group = getattr(default, name)
            group_data = {k: getattr(group, k) for k in group.model_fields_set}
            group_data.update(value)
            try:
                data[name] = type(group).model_validate(group_data)
            except ValidationError as exc:
                raise _explained(exc, (*prefix, name), winners) from None
        elif name == "env":
            data["env"] = {**default.env, **value}
        else:
            data[name] = value
    try:
        return type(default).model_validate(data)
    except ValidationError as exc:
        raise _explained(exc, prefix, winners) from None


def _explained(
    exc: ValidationError, prefix: Path, winners: dict[Path, Patch], stage_names: list[str] = ()
) -> ConfigError:
    """The schema's lines for ``exc``, each with the origin of the value that caused it."""
    lines = []
    for problem in validation_problems(exc, stage_names, prefix):
        line = _with_origin(problem.text, list(problem.paths), winners)
        lines.append(f"{line}; fix: {problem.fix}" if problem.fix else line)
    return ConfigError("invalid deployment:\n  " + "\n  ".join(lines))


def _with_origin(message: str, paths: list[Path], winners: dict[Path, Patch]) -> str:
    origins = [str(winners[p].origin) for p in paths if p in winners]
    if not origins:
        # A model-level check (loc is the container): find the written field it names.
        for base in paths:
            origins += [
                str(patch.origin)
                for path, patch in winners.items()
                if path[: len(base)] == base and len(path) > len(base) and path[-1] in message
            ]
    return f"{message} (set by {', '.join(origins)})" if origins else message
