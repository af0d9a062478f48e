"""Engine backends by name, and the planning-time check of a stage's ``engine.*`` group.

An engine stage's ``engine`` group is free-form in the schema (a pipeline may
target any backend); the backend it selects (``engine.backend``, default
``torch``) declares the keys it accepts as a pydantic model, and
:func:`validate_engine_settings` refuses anything else by name. This module
imports no ML framework: the planner calls it in the parent process, and the
engine class itself is imported lazily, only by :func:`create_engine` in the
child that runs the stage.

``sglang`` runs a stage on SGLang's engine; its keys are SGLang's ServerArgs
(:mod:`omni_core.engine.sglang_settings`, whose table is generated from the
pinned SGLang, so SGLang itself is never imported here). Whether SGLang is
installed is checked before serving (:func:`check_installed`), not at
planning: a plan can be made on a machine that will not serve it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, NotImplementedYet, did_you_mean, suggestion
from .interface import EngineSettings

DEFAULT_BACKEND = "torch"


class EngineSettingsError(ConfigError):
    """A stage's ``engine.*`` group refused by its backend; ``keys`` are the keys at fault.

    The keys let the config checks blame the flag or file line that wrote each
    of them, rather than every key of the group.
    """

    def __init__(
        self,
        message: str,
        *,
        keys: tuple[str, ...] = (),
        hint: str | None = None,
        stage_fields: tuple[str, ...] = (),
    ):
        super().__init__(message, hint=hint)
        self.keys = keys
        self.stage_fields = stage_fields  # stage-level fields also at fault (placement)


@dataclass(frozen=True)
class EngineBackend:
    """One backend: the settings it accepts and where its engine class lives.

    ``engine`` is an import string ``module:Class`` (imported only when an
    engine is built); ``settings`` the settings model or an import string for
    it (a large model built only when a stage selects the backend);
    ``unavailable`` is the reason a reserved backend cannot be used yet, or
    None. ``package`` is the distribution the engine needs, with the command
    that installs it (checked before serving).
    """

    name: str
    settings: type[BaseModel] | str
    engine: str | None
    unavailable: str | None = None
    package: tuple[str, str] | None = None

    def settings_model(self) -> type[BaseModel]:
        if isinstance(self.settings, str):
            module_name, _, attribute = self.settings.partition(":")
            return getattr(importlib.import_module(module_name), attribute)
        return self.settings

    def accepted_keys(self) -> list[str]:
        return sorted(self.settings_model().model_fields)


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
    if name == "sglang":
        data = _sglang_keys(stage_name, data)
    accepted = backend.accepted_keys()
    unknown = sorted(set(data) - set(accepted))
    if unknown:
        key = unknown[0]
        others = f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        if len(accepted) > 40:  # SGLang's ServerArgs: the closest name, not all 500
            close = did_you_mean(key, accepted)
            tail = (f"did you mean: {close}? " if close else "") + (
                f"the accepted keys are the fields of SGLang {_sglang_version()}'s ServerArgs "
                f"(omni config explain DEPLOY stages.{stage_name}.engine.KEY describes one)"
            )
        else:
            tail = suggestion(key, accepted, kind="accepted engine.* keys")
        raise EngineSettingsError(
            f"stage {stage_name!r}: engine.{key}{others} is not a setting of the {name!r} "
            f"engine backend; " + tail,
            keys=tuple(unknown),
            hint=f"remove --{stage_name}.engine.{key} (or its line in the deploy file), "
            "or correct its name",
        )
    try:
        settings = backend.settings_model().model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        reasons = "; ".join(_reason(err) for err in errors)
        keys = tuple(dict.fromkeys(str(err["loc"][0]) for err in errors if err["loc"]))
        fix = ", ".join(f"--{stage_name}.engine.{key}" for key in keys)
        if keys:
            hint = f"set {fix} to a value in range, or leave it unset for the default"
        else:  # a rule across keys: the message says the fix; locate the keys it names
            keys = tuple(key for key in data if any(key in _reason(err) for err in errors))
            hint = None
        message = f"stage {stage_name!r}: {reasons}"
        raise EngineSettingsError(message, keys=keys, hint=hint) from None
    return cast(EngineSettings, settings)  # a later backend may subclass EngineSettings


def _reason(error: Any) -> str:
    """One pydantic error as ``engine.KEY: why`` (a rule across keys: its message alone)."""
    from ..schema.validation import plain_bound

    if not error["loc"]:
        return "engine: " + str(error["msg"]).removeprefix("Value error, ")
    where = ".".join(str(part) for part in error["loc"])
    return f"engine.{where}: {plain_bound(error) or error['msg']}"


def _sglang_version() -> str:
    from .sglang_args import SGLANG_VERSION

    return SGLANG_VERSION


def _sglang_keys(stage_name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Renamed spellings under today's names; keys omni sets itself refused, saying why."""
    from .sglang_settings import OMNI_OWNED, RENAMED, normalise, renamed_clashes

    clashes = renamed_clashes(data)
    if clashes:
        old = clashes[0]
        raise EngineSettingsError(
            f"stage {stage_name!r}: engine.{old} and engine.{RENAMED[old]} are the same "
            f"setting (SGLang {_sglang_version()} calls it {RENAMED[old]})",
            keys=(old, RENAMED[old]),
            hint=f"keep only engine.{RENAMED[old]}",
        )
    owned = sorted(set(data) & set(OMNI_OWNED))
    if owned:
        key = owned[0]
        raise EngineSettingsError(
            f"stage {stage_name!r}: engine.{key} is set by omni on the sglang backend "
            f"({OMNI_OWNED[key]})",
            keys=(key,),
            hint=f"remove --{stage_name}.engine.{key} (or its line in the deploy file)",
        )
    return normalise(data)


def _placement_conflicts(stage: Any, settings: Any) -> None:
    from .sglang_settings import placement_conflicts

    conflicts = placement_conflicts(stage, settings)
    if conflicts:
        key, field, message = conflicts[0]
        raise EngineSettingsError(
            f"stage {stage.name!r}: {message}; placement decides it and passes it to SGLang",
            keys=(key,),
            stage_fields=(field,),
            hint=f"remove engine.{key} (placement sets it), or change the stage's {field}",
        )


def check_installed(config: Any) -> list[tuple[str, str, str]]:
    """``(stage, message, fix)`` for each engine stage whose backend's package is missing.

    Called before serving, in the parent, without importing the package
    (``importlib.util.find_spec``), so a missing SGLang is a clear exit 2
    instead of a child process that dies at start-up.
    """
    import importlib.util
    import sys

    problems = []
    for stage in config.stages:
        if not stage.is_engine or getattr(stage, "engine", None) is None:
            continue
        name = getattr(stage.engine, "backend", None) or (stage.engine.model_extra or {}).get(
            "backend", DEFAULT_BACKEND
        )
        backend = _BACKENDS.get(str(name))
        if backend is None or backend.package is None:
            continue
        package, install = backend.package
        if importlib.util.find_spec(package) is None:
            problems.append(
                (
                    stage.name,
                    f"stage {stage.name!r} runs on the {backend.name!r} engine backend, but "
                    f"{package} is not installed in this environment ({sys.executable})",
                    install,
                )
            )
    return problems


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
    settings = validate_engine_settings(
        stage.name, {k: v for k, v in written.items() if v is not None}
    )
    supported = list(getattr(stage, "engine_backends", None) or [DEFAULT_BACKEND])
    if settings.backend not in supported:
        raise EngineSettingsError(
            f"stage {stage.name!r} cannot run on the {settings.backend!r} engine backend: its "
            f"factory drives {', '.join(repr(b) for b in supported)}",
            keys=("backend",),
            hint=f"remove --{stage.name}.engine.backend (or its line in the deploy file)",
        )
    if settings.backend == "sglang":
        _placement_conflicts(stage, settings)
    return settings


def with_running_requests(settings: Any, running: int | None) -> Any:
    """``settings`` with the plan's memory-sized ``max_running_requests`` (None: unchanged).

    A number the deploy file or a flag wrote always wins; the plan sizes only
    what was left unwritten (:mod:`omni_core.plan.caches`), and the planner,
    the runtime's admission and the stage's factory all apply it through here.
    """
    if running is None or "max_running_requests" in settings.model_fields_set:
        return settings
    return settings.model_copy(update={"max_running_requests": running})


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
        settings="omni_core.engine.sglang_settings:SGLangSettings",
        engine="omni_core.engine.sglang_engine:SGLangEngine",
        package=(
            "sglang",
            "build the opt-in SGLang environment with `make sglang-env` and run "
            '`.venv-sglang/bin/omni serve ...` (README, "Engine backends")',
        ),
    )
)
