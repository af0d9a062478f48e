"""Checks of a resolved deployment against the world outside it: files and plugins.

The schema checks what a value is; these check what it points at: a model
path the stages would fail to load, a media directory that does not exist, a
transport no plugin provides. They run right after resolution, so
``omni config``, ``omni plan`` and ``omni serve`` refuse the same deployment
in the same words, with the origin (file:line or flag) of every value
involved, before any process starts. Nothing here imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import ConfigError, OmniError, PluginError
from .origin import Path

if TYPE_CHECKING:
    from ..plugins import OmniPlugins
    from .resolve import Resolution

Problem = tuple[tuple[Path, ...], str, str]  # paths it concerns, message, fix


def check_outside(resolution: Resolution, plugins: OmniPlugins) -> None:
    """ConfigError listing every problem, each with its origins and fix; else nothing."""
    problems = [
        *resolution.config.model_source_problems(),
        *resolution.config.process_problems(),
        *resolution.config.tensor_parallel_problems(),
        *_media_dir_problems(resolution),
        *_transport_problems(resolution, plugins),
        *_engine_problems(resolution),
    ]
    if problems:
        lines = [_line(resolution, paths, message, fix) for paths, message, fix in problems]
        raise ConfigError("invalid deployment:\n  " + "\n  ".join(lines))


def fetch_sources(resolution: Resolution) -> None:
    """Fetch the model's files before launch (see ``PipelineConfig.fetch_model_source``);
    ConfigError naming ``model_path`` and who set it when they cannot be had."""
    try:
        resolution.config.fetch_model_source()
    except FileNotFoundError as exc:
        fix = "check model_path (a typo in a hub id is the usual cause), or give a local directory"
        raise ConfigError(_line(resolution, [("model_path",)], str(exc), fix)) from None


def check_engine_packages(resolution: Resolution) -> None:
    """Each engine stage's backend is installed here (SGLang is opt-in); ConfigError naming
    the stage's ``engine.backend`` and who set it, and how to install it, when not."""
    from ..engine.backends import check_installed

    problems = check_installed(resolution.config)
    if problems:
        stage, message, fix = problems[0]
        path = [("stages", stage, "engine", "backend")]
        raise ConfigError(_line(resolution, path, message, fix))


def _line(resolution: Resolution, paths: Iterable[Path], message: str, fix: str) -> str:
    origins = []
    for path in paths:
        record = resolution.records.get(tuple(path))
        if record is not None and record.winner is not None:
            origins.append(str(record.winner.origin))
    where = f" (set by {', '.join(dict.fromkeys(origins))})" if origins else ""
    return f"{message}{where}; fix: {fix}" if fix else f"{message}{where}"


def _engine_problems(resolution: Resolution) -> list[Problem]:
    """Each engine stage's ``engine.*`` group, checked by the backend it selects.

    The backend's settings model is the one place that knows the keys and
    their ranges (the schema only types the common ones for coercion).
    """
    from ..engine.backends import engine_settings

    problems: list[Problem] = []
    for stage in resolution.config.stages:
        if not stage.is_engine or getattr(stage, "engine", None) is None:
            continue
        try:
            engine_settings(stage)
        except OmniError as exc:
            path = ("stages", stage.name, "engine")
            # Blame the keys the backend named (else every key the group was given).
            keys = getattr(exc, "keys", None) or _written(stage.engine)
            paths = [path, *(tuple((*path, key)) for key in keys)]
            # A contradiction with placement blames the stage's field as well.
            paths += [("stages", stage.name, f) for f in getattr(exc, "stage_fields", ())]
            problems.append((tuple(paths), exc.message, exc.hint or ""))
    return problems


def _written(group: object) -> list[str]:
    dump = getattr(group, "model_dump", None)
    return [k for k, v in (dump(exclude_unset=True) if dump else {}).items() if v is not None]


def _media_dir_problems(resolution: Resolution) -> list[Problem]:
    problems: list[Problem] = []
    for index, directory in enumerate(resolution.config.server.media_dirs):
        if not os.path.isabs(directory):
            message = f"server.media_dirs[{index}] {directory!r} is not an absolute path"
        elif not os.path.isdir(directory):
            state = "is not a directory" if os.path.exists(directory) else "does not exist"
            message = f"server.media_dirs[{index}] {directory!r} {state}"
        else:
            continue
        problems.append(
            (
                (("server", "media_dirs"),),
                message,
                "list existing directories, by absolute path, whose files clients may read",
            )
        )
    return problems


def _transport_problems(resolution: Resolution, plugins: OmniPlugins) -> list[Problem]:
    runtime = resolution.config.runtime
    named: list[tuple[Path, str]] = []
    if runtime.transport != "auto":
        named.append((("runtime", "transport"), runtime.transport))
    named += [(("runtime", "edge_transports"), t) for t in runtime.edge_transports.values()]
    named.append((("runtime", "cross_node_transport"), runtime.cross_node_transport))
    problems: list[Problem] = []
    config = resolution.config
    edges = sorted({f"{s.name}->{t}" for s in config.stages for t in s.targets})
    for edge in runtime.edge_transports:
        if edge not in edges:
            problems.append(
                (
                    (("runtime", "edge_transports"),),
                    f"runtime.edge_transports names {edge!r}, which is not an edge of the pipeline",
                    "edges: " + ", ".join(edges),
                )
            )
    for path, name in named:
        try:
            plugins.transport(name)
        except PluginError as exc:
            problems.append(((path,), f"{'.'.join(path)}: {exc.message}", exc.hint or ""))
    try:
        plugins.launcher(runtime.launcher)
    except PluginError as exc:
        path = ("runtime", "launcher")
        problems.append(((path,), f"runtime.launcher: {exc.message}", exc.hint or ""))
    return problems
