"""Building a stage: the two channels that reach a factory, and standard kwargs.

* author channel: ``stage.author_kwargs``, wired by the pipeline author in code;
* config channel: ``stage.factory.*``, from deploy files and flags.

Per key the config channel wins. Standard kwargs (``model_path``, ``gpu_id``,
``gpu_ids``, ``gpu_memory_fraction``, ``total_reserve_bytes``, ``tp_rank``,
``tp_size``, ``replica``, and for engine stages ``engine_args``: the
``engine.*`` group as a dict) are injected only where the factory's signature
declares them, so a factory asks for exactly what it uses. A configured key
the factory does not accept is refused by name at construction.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError


@dataclass(frozen=True)
class StageContext:
    """What placement decided for one stage instance, as its factory sees it."""

    instance: str
    process: str
    replica: int = 0
    tp_rank: int = 0
    tp_size: int = 1
    gpu_ids: tuple[int, ...] = ()
    gpu_memory_fraction: float | None = None
    total_reserve_bytes: int | None = None
    # engine.max_running_requests the plan sized from memory (None: the settings' own)
    running_requests: int | None = None

    def standard_kwargs(self, model_path: str) -> dict[str, Any]:
        return {
            "model_path": model_path,
            "gpu_id": self.gpu_ids[0] if self.gpu_ids else None,
            "gpu_ids": list(self.gpu_ids),
            "gpu_memory_fraction": self.gpu_memory_fraction,
            "total_reserve_bytes": self.total_reserve_bytes,
            "tp_rank": self.tp_rank,
            "tp_size": self.tp_size,
            "replica": self.replica,
        }


def import_object(path: str, *, what: str) -> Any:
    """Import ``package.module:attribute`` with an error that names ``what`` needed it."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{what}: {path!r} is not an import string 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what}: cannot import {module_name!r}: {exc}") from exc
    try:
        obj = module
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError(
            f"{what}: module {module_name!r} has no attribute {attribute!r}"
        ) from None
    return obj


def factory_kwargs(
    factory: Callable[..., Any],
    *,
    stage_name: str,
    factory_path: str,
    author: dict[str, Any],
    config: dict[str, Any],
    standard: dict[str, Any],
) -> dict[str, Any]:
    """Merge the channels for ``factory``; refuse config keys it cannot take."""
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    refused = sorted(k for k in config if k not in accepted and not takes_any)
    if refused:
        raise ConfigError(
            f"stage {stage_name!r}: factory.{refused[0]} is not a parameter of {factory_path}",
            hint=f"it accepts: {', '.join(sorted(accepted)) or '(nothing)'}",
        )
    kwargs = {k: v for k, v in standard.items() if k in accepted}
    kwargs.update(author)
    kwargs.update(config)
    return kwargs


def _engine_kwargs(stage: Any, *, validated: bool, running: int | None = None) -> dict[str, Any]:
    """An engine stage's ``engine.*`` group: ``engine_settings`` (the backend's validated
    model, defaults filled in, the plan's memory-sized ``running`` requests applied: the
    same numbers planning and admission read) or, for factories that want the raw keys,
    ``engine_args``."""
    engine = getattr(stage, "engine", None)
    if engine is None:
        return {}
    from .engine.backends import validate_engine_settings, with_running_requests

    written = {k: v for k, v in engine.model_dump().items() if v is not None}
    if not validated:  # validated only for a factory that asks: it may be another backend's
        return {"engine_args": written}
    return {
        "engine_args": written,
        "engine_settings": with_running_requests(
            validate_engine_settings(stage.name, written), running
        ),
    }


def build_from_factory(stage: Any, pipeline: Any, context: StageContext) -> Any:
    """The default construction: import the stage's factory and call it."""
    factory = import_object(stage.factory_path, what=f"stage {stage.name!r} factory")
    group = stage.factory
    values = group.model_dump()
    # Declared defaults fill in under the author channel; what a deploy file
    # or flag wrote forms the config channel (fields_set holds free-form keys too).
    declared_defaults = {
        k: v for k, v in values.items() if k not in group.model_fields_set and v is not None
    }
    config = {k: v for k, v in values.items() if k in group.model_fields_set}
    kwargs = factory_kwargs(
        factory,
        stage_name=stage.name,
        factory_path=stage.factory_path,
        author={**declared_defaults, **stage.author_kwargs},
        config=config,
        standard={
            **context.standard_kwargs(pipeline.model_path),
            **_engine_kwargs(
                stage,
                validated="engine_settings" in inspect.signature(factory).parameters,
                running=context.running_requests,
            ),
        },
    )
    return factory(**kwargs)
