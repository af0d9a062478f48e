"""Rendering a resolution: explain blocks, the diff, and the resolved TOML."""

from __future__ import annotations

import json
from typing import Any

import tomli_w

from .origin import Layer, dotted
from .paths import STAGE_LEAVES, TOP_GROUPS, TOP_LEAVES
from .resolve import MISSING, PathRecord, Resolution


def show(value: Any) -> str:
    if value is MISSING:
        return "(unset)"
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def explain(record: PathRecord) -> str:
    """The chain of one path: default, each write, which won, and the validated value."""
    head = f"{dotted(record.path)} = {show(record.final)}"
    rows = [(show(record.default), "model default")]
    winner = record.winner
    for patch in record.writes:
        status = "[winner]" if patch is winner else "[superseded]"
        rows.append((show(patch.value), f"{patch.origin}  {status}"))
    if not record.writes:
        rows[0] = (show(record.default), "model default (nothing overrides it)")
    elif record.final != winner.value:
        rows.append((show(record.final), "after validation"))
    width = max(len(value) for value, _ in rows)
    return "\n".join([head, *(f"  {value:<{width}}  <- {what}" for value, what in rows)])


def diff_lines(resolution: Resolution, against: str = "defaults") -> list[str]:
    """``path: before -> after`` for each value that differs from the model's default,
    or (``against="file"``) from what the deploy file (over the defaults) made it:
    then only what the command line changed is listed."""
    lines = []
    for record in resolution.records.values():
        before = record.default
        if against == "file":
            written = [w for w in record.writes if w.origin.layer <= Layer.FILE]
            before = written[-1].value if written else record.default
        if record.final != before:
            lines.append(f"{dotted(record.path)}: {show(before)} -> {show(record.final)}")
    if lines:
        return lines
    if against == "file":
        return ["no changes: the command line changes nothing the deploy file says"]
    return ["no changes: every value is the model default"]


def provenance_blocks(resolution: Resolution) -> list[str]:
    return [explain(record) for record in resolution.records.values()]


def config_document(resolution: Resolution, *, toml: bool = True) -> dict[str, Any]:
    """The whole resolved deployment in deploy-file shape (accepted again as input).

    TOML has no null, so for TOML a null that overrides a real default is
    written as ``"none"`` (which the resolver reads back as null); JSON keeps nulls.
    """
    dump = _Dumper("none" if toml else None)
    config, defaults = resolution.config, resolution.defaults
    doc: dict[str, Any] = {"pipeline": resolution.pipeline_cls.pipeline_name}
    for name in TOP_LEAVES:
        doc[name] = getattr(config, name)
    for name in TOP_GROUPS:
        group = dump.fields(getattr(config, name), getattr(defaults, name))
        if group:
            doc[name] = group
    if config.processes:
        doc["processes"] = {n: dump.fields(p, None) for n, p in config.processes.items()}
    doc["stages"] = {s.name: dump.stage(s, defaults.stage(s.name)) for s in config.stages}
    return doc


def _without_nulls(table: dict[str, Any]) -> dict[str, Any]:
    """A table in a list: its unset (null) keys are left out, as TOML cannot write null."""
    return {k: v for k, v in table.items() if v is not None}


class _Dumper:
    def __init__(self, null: Any):
        self.null = null

    def leaf(self, value: Any, default: Any) -> Any:
        if value is None:
            return self.null if default is not None else MISSING
        return value

    def fields(self, model: Any, default: Any) -> dict[str, Any]:
        base = default.model_dump() if default is not None else {}
        out = {}
        for key, value in model.model_dump().items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                value = [_without_nulls(item) for item in value]  # [[cluster.nodes]]
            leaf = self.leaf(value, base.get(key))
            if leaf is not MISSING:
                out[key] = leaf
        return out

    def stage(self, stage: Any, default: Any) -> dict[str, Any]:
        body = {}
        for name in STAGE_LEAVES:
            leaf = self.leaf(getattr(stage, name), getattr(default, name))
            if leaf is not MISSING:
                body[name] = leaf
        if stage.env:
            body["env"] = dict(stage.env)
        for group in ("factory", "engine"):
            if hasattr(stage, group):
                values = self.fields(getattr(stage, group), getattr(default, group))
                if values:
                    body[group] = values
        return body


def config_toml(resolution: Resolution) -> str:
    header = (
        f"# resolved deployment of pipeline {resolution.pipeline_cls.pipeline_name!r}"
        + (f" from {resolution.deploy_file}" if resolution.deploy_file else "")
        + "\n# every value is written out; omni accepts this file as a deploy file\n"
    )
    return header + tomli_w.dumps(config_document(resolution))


def config_json(resolution: Resolution) -> str:
    return json.dumps(config_document(resolution, toml=False), indent=2)
