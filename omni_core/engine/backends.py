"""Engine backends by name, and the planning-time check of a stage's ``engine.*`` group.

An engine stage's ``engine`` group is free-form in the schema (a pipeline may
target any backend); the backend it selects (``engine.backend``, default
``torch``) declares the keys it accepts as a pydantic model, and
:func:`validate_engine_settings` refuses anything else by name. This module
imports no ML framework: the planner calls it in the parent process, and the
engine class itself is imported lazily, only by :func:`create_engine` in the
child that runs the stage.

``sglang`` is registered but not available yet: selecting it is refused with
:class:`~omni_core.errors.NotImplementedYet`, so a deploy file that names it
fails at planning instead of at start-up, and the seam is in place for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, NotImplementedYet, suggestion
from .interface import EngineSettings

DEFAULT_BACKEND = "torch"


class EngineSettingsError(ConfigError):
    """A stage's ``engine.*`` group refused by its backend; ``keys`` are the keys at fault.

    The keys let the config checks blame the flag or file line that wrote each
    of them, rather than every key of the group.
    """

    def __init__(self, message: str, *, keys: tuple[str, ...] = (), hint: str | None = None):
        super().__init__(message, hint=hint)
        self.keys = keys


@dataclass(frozen=True)
class EngineBackend:
    """One backend: the settings it accepts and where its engine class lives.

    ``engine`` is an import string ``module:Class`` (imported only when an
    engine is built); ``unavailable`` is the reason a reserved backend cannot
    be used yet, or None.
    """

    name: str
    settings: type[BaseModel]
    engine: str | None
    unavailable: str | None = None

    def accepted_keys(self) -> list[str]:
        return sorted(self.settings.model_fields)


_BACKENDS: dict[str, EngineBackend] = {}


def register_backend(backend: EngineBackend, *, replace: bool = False) -> None:
    """Add a backend; a second one of the same name is refused unless ``replace``."""
    if backend.name in _BACKENDS and not replace:
        raise ConfigError(f"engine backend {backend.name!r} is registered twice")
    _BACKENDS[backend.name] = backend


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def get_backend(name: str, *, stage_name: str | None = None) -> EngineBackend:
    """The backend called ``name``; unknown and not-yet-available ones are refused."""
    where = f"stage {stage_name!r}: " if stage_name else ""
    backend = _BACKENDS.get(name)
    if backend is None:
        raise ConfigError(
            f"{where}unknown engine backend {name!r} (engine.backend); "
            + suggestion(name, _BACKENDS, kind="engine backends")
        )
    if backend.unavailable:
        raise NotImplementedYet(f"{where}{backend.unavailable}")
    return backend


def validate_engine_settings(stage_name: str, engine: Mapping[str, Any]) -> EngineSettings:
    """The validated settings of one engine stage, or a ConfigError naming the bad key.

    ``engine`` is the stage's ``engine`` group as a plain mapping (unset keys
    left out). Unknown keys are refused with the accepted ones and the closest
    match; a value of the wrong type or range is refused with pydantic's reason.
    """
    data = dict(engine)
    name = str(data.get("backend", DEFAULT_BACKEND))
    backend = get_backend(name, stage_name=stage_name)
    accepted = backend.accepted_keys()
    unknown = sorted(set(data) - set(accepted))
    if unknown:
        key = unknown[0]
        others = f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        raise EngineSettingsError(
            f"stage {stage_name!r}: engine.{key}{others} is not a setting of the {name!r} "
            f"engine backend; " + suggestion(key, accepted, kind="accepted engine.* keys"),
            keys=tuple(unknown),
            hint=f"remove --{stage_name}.engine.{key} (or its line in the deploy file), "
            "or correct its name",
        )
    try:
        settings = backend.settings.model_validate(data)
    except ValidationError as exc:
        from ..schema.validation import plain_bound

        errors = exc.errors()
        reasons = "; ".join(
            f"engine.{'.'.join(str(p) for p in err['loc'])}: {plain_bound(err) or err['msg']}"
            for err in errors
        )
        keys = tuple(dict.fromkeys(str(err["loc"][0]) for err in errors if err["loc"]))
        fix = ", ".join(f"--{stage_name}.engine.{key}" for key in keys)
        raise EngineSettingsError(
            f"stage {stage_name!r}: {reasons}",
            keys=keys,
            hint=f"set {fix} to a value in range, or leave it unset for the default"
            if keys
            else None,
        ) from None
    return cast(EngineSettings, settings)  # a later backend may subclass EngineSettings


def engine_settings(stage: Any) -> EngineSettings:
    """An engine stage's ``engine.*`` group as its backend validates it (defaults filled in).

    The schema lets the group hold any key (the backend, not the schema, knows
    what it accepts); the backend's own declared settings refuse the rest and
    supply the defaults of what the stage leaves unset, so the config checks,
    the planner's estimates, the runtime's admission limit and the engine all
    read the same numbers. Raises the backend's OmniError.
    """
    engine = getattr(stage, "engine", None)
    written = {} if engine is None else engine.model_dump(exclude_unset=True)
    return validate_engine_settings(stage.name, {k: v for k, v in written.items() if v is not None})


def create_engine(model: Any, settings: EngineSettings, **kwargs: Any) -> Any:
    """Build the engine ``settings.backend`` names, importing it only now (in the child)."""
    backend = get_backend(settings.backend)
    assert backend.engine is not None  # an available backend always names its class
    module_name, _, attribute = backend.engine.partition(":")
    engine_class = getattr(importlib.import_module(module_name), attribute)
    return engine_class(model, settings, **kwargs)


register_backend(
    EngineBackend(
        name="torch",
        settings=EngineSettings,
        engine="omni_core.engine.torch_engine:TorchEngine",
    )
)
register_backend(
    EngineBackend(
        name="sglang",
        settings=EngineSettings,
        engine=None,
        unavailable=(
            "the SGLang engine backend is not available yet; "
            'use engine.backend = "torch" (the default)'
        ),
    )
)
