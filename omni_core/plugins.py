"""The plugin manager: a typed facade over pluggy, in the manner of tox 4.

It registers the built-in plugins, loads the ``omni`` entry points (restricted
by ``OMNI_PLUGINS``), survives plugins that fail to import or implement a hook
omni does not have, and answers the three questions the rest of the core asks:
which pipelines, placement policies, transports and launchers exist, and who registered
them.

A plugin is one *object* (usually a module): registering in-process a module
that is already loaded from its entry point is the same plugin, listed once
under its distribution's name; the in-process name becomes an alias of it.
"""

from __future__ import annotations

import importlib
import os
import re
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginError, suggestion
from .lazy_pipeline import LazyPipeline
from .plugin_checks import describe, hook_names, unknown_hooks, unknown_hooks_message

BUILTIN_PLUGINS = (
    "omni_core.builtins.factory",
    "omni_core.builtins.placement",
    "omni_core.builtins.transports",
    "omni_core.builtins.launchers",
)
ENV_VAR = "OMNI_PLUGINS"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class PluginRecord:
    """What the listing shows of one plugin."""

    name: str
    version: str | None = None
    builtin: bool = False
    entry_point: str | None = None
    error: str | None = None
    plugin: object | None = None


@dataclass
class Registered:
    """One registered item (pipeline, policy, transport) and the plugin that gave it."""

    name: str
    value: Any
    plugin: str


@dataclass
class _Registries:
    pipelines: dict[str, Registered] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    policies: dict[str, Registered] = field(default_factory=dict)
    transports: dict[str, Registered] = field(default_factory=dict)
    launchers: dict[str, Registered] = field(default_factory=dict)
    conflicts: dict[str, list[str]] = field(default_factory=dict)  # by kind
    collected: set[str] = field(default_factory=set)  # kinds whose hooks were called
    # Errors found while calling registration hooks, by plugin. Kept here, not on
    # the record, so they go away with the state that caused them.
    errors: dict[str, str] = field(default_factory=dict)
    by_plugin: dict[str, dict[str, list[str]]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Kind:
    """One kind of registered item: its hook, its table, and its name in messages."""

    hook: str
    attribute: str  # the table in _Registries
    singular: str
    plural: str
    name_attribute: str  # where an item keeps its name


_KINDS = {
    "pipelines": _Kind(
        "omni_register_pipelines", "pipelines", "pipeline", "pipelines", "pipeline_name"
    ),
    "placement_policies": _Kind(
        "omni_register_placement_policies",
        "policies",
        "placement policy",
        "placement policies",
        "name",
    ),
    "transports": _Kind(
        "omni_register_transports", "transports", "transport", "transports", "name"
    ),
    "launchers": _Kind("omni_register_launchers", "launchers", "launcher", "launchers", "name"),
}


class OmniPlugins:
    """The plugins of this process and what they registered."""

    def __init__(self, *, load_entry_points: bool = True, env: dict[str, str] | None = None):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        # Other names a registered plugin answers to (an in-process name of a
        # module that was already loaded from its entry point), to its record's name.
        self.aliases: dict[str, str] = {}
        self.unknown_requested: list[str] = []
        self._registries: _Registries | None = None
        for module_name in BUILTIN_PLUGINS:
            module = importlib.import_module(module_name)
            self._add(PluginRecord(name=module_name, builtin=True, plugin=module))
        if load_entry_points:
            self._load_entry_points(os.environ if env is None else env)

    # -- loading --------------------------------------------------------------
    def _add(self, record: PluginRecord) -> None:
        if record.plugin is not None and record.error is None:
            record.error = self._register_hooks(record)
        self.records[record.name] = record
        self._registries = None

    def _register_hooks(self, record: PluginRecord) -> str | None:
        """Register ``record.plugin``'s hooks; the load error that kept them out, if any.

        A plugin with an invalid or unknown hook is not registered at all: half
        a plugin (its transports without the pipeline it misspelt) would fail
        later and further from the mistake.
        """
        try:
            self.pm.register(record.plugin, name=record.name)
        except pluggy.PluginValidationError as exc:
            if self.pm.is_registered(record.plugin):
                self.pm.unregister(record.plugin)
            return describe(exc)
        unknown = unknown_hooks(self.pm, record.plugin)
        if unknown:
            self.pm.unregister(record.plugin)
            return unknown_hooks_message(unknown, hook_names(self.pm))
        return None

    def record_of(self, plugin: object) -> PluginRecord | None:
        """The record of ``plugin`` (the very object), if it is registered here."""
        for record in self.records.values():
            if record.plugin is plugin:
                return record
        return None

    def _load_entry_points(self, env: dict[str, str]) -> None:
        wanted = _requested(env.get(ENV_VAR))
        matched: set[str] = set()
        for ep in sorted(metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP), key=_ep_key):
            dist_name = ep.dist.name if ep.dist else ep.name
            keys = {_normalise(ep.name), _normalise(dist_name)}
            if wanted is not None:
                hit = keys & wanted
                if not hit:
                    continue
                matched |= hit
            record = PluginRecord(
                name=dist_name,
                version=ep.dist.version if ep.dist else None,
                entry_point=f"{ep.name} = {ep.value}",
            )
            try:
                record.plugin = ep.load()
            except Exception as exc:  # a broken plugin must not break the listing
                record.error = describe(exc)
            existing = self.record_of(record.plugin) if record.plugin is not None else None
            if existing is not None:  # one module behind two entry points: one plugin
                if record.name not in self.records:
                    self.aliases.setdefault(record.name, existing.name)
                continue
            if record.name in self.records:
                record.name = f"{record.name}:{ep.name}"
            self._add(record)
        if wanted is not None:
            self.unknown_requested = sorted(wanted - matched)

    # -- in-process registration (tests, embedding) ----------------------
    def register(self, plugin: object, name: str | None = None, version: str | None = None) -> str:
        """Register a plugin object in this process, without installing anything.

        Returns the name the plugin is listed under. Registering an object that
        is already registered (a module loaded from its entry point) is the same
        plugin: nothing changes but ``name``, which becomes an alias of it, and
        the established name is returned. A plugin with an unknown or invalid
        hook is recorded with its load error, as entry-point loading does.
        """
        existing = self.record_of(plugin)
        if existing is not None:
            if name and name != existing.name and self.aliases.get(name) != existing.name:
                self._refuse_taken(name, plugin)
                self.aliases[name] = existing.name
            return existing.name
        name = name or getattr(plugin, "__name__", None) or f"plugin-{id(plugin)}"
        self._refuse_taken(name, plugin)
        self._add(PluginRecord(name=name, version=version, plugin=plugin))
        return name

    def _refuse_taken(self, name: str, plugin: object) -> None:
        owner = self.records.get(self.aliases.get(name, name))
        if owner is None:
            return
        where = f"from the entry point {owner.entry_point!r}" if owner.entry_point else "in-process"
        what = f"{owner.plugin!r}" if owner.plugin is not None else f"failed: {owner.error}"
        raise PluginError(
            f"a plugin named {name!r} is already registered ({where}: {what}), "
            f"and {plugin!r} is another object",
            hint=f"register it under another name, or unregister {name!r} first",
        )

    def register_broken(self, name: str, error: BaseException) -> None:
        """Record a plugin that failed to load (as entry-point loading does)."""
        self._add(PluginRecord(name=name, error=describe(error)))

    def unregister(self, name: str) -> None:
        """Undo a registration.

        By an alias (the name an in-process ``register`` gave a plugin that was
        already loaded), only the alias goes: the plugin stays, as installed.
        By a plugin's own name, the plugin and its aliases go.
        """
        if name in self.aliases:
            del self.aliases[name]
            return
        if name not in self.records:
            raise PluginError(
                f"no plugin named {name!r} is registered",
                hint=suggestion(name, [*self.records, *self.aliases], kind="registered plugins"),
            )
        record = self.records.pop(name)
        for alias in [a for a, target in self.aliases.items() if target == name]:
            del self.aliases[alias]
        if record.plugin is not None and self.pm.is_registered(record.plugin):
            self.pm.unregister(record.plugin)
        self._registries = None

    @contextmanager
    def registered(self, plugin: object, name: str | None = None) -> Iterator[str]:
        """Register ``plugin`` for the duration of a ``with`` block; yields its listed name.

        On leaving, exactly what the block added is removed: a plugin that was
        already registered (from its entry point) stays registered.
        """
        was = self.record_of(plugin)
        had_alias = name in self.aliases if name else True
        listed = self.register(plugin, name)
        try:
            yield listed
        finally:
            if was is None:
                if self.records.get(listed) is not None:
                    self.unregister(listed)
            elif not had_alias and name in self.aliases:
                self.unregister(name)  # drops the alias only

    def in_process_modules(self) -> list[str]:
        """Names of the plugin modules registered in-process (not from an entry point).

        A runtime's children load entry points themselves; these they import
        by name (``Runtime(plugin_modules=...)``), from the ``sys.path`` they
        inherit. Objects that are not modules cannot cross, nor can plugins
        that failed to load.
        """
        return [
            record.plugin.__name__
            for record in self.records.values()
            if not record.builtin
            and record.entry_point is None
            and record.error is None
            and isinstance(record.plugin, types.ModuleType)
        ]

    # -- what the plugins registered -----------------------------------------
    def hooks_of(self, record: PluginRecord) -> list[str]:
        if record.plugin is None or not self.pm.is_registered(record.plugin):
            return []
        return sorted(caller.name for caller in self.pm.get_hookcallers(record.plugin) or [])

    @property
    def registries(self) -> _Registries:
        """Everything every plugin registered (calls all registration hooks)."""
        return self._registry(*_KINDS)

    def _registry(self, *kinds: str) -> _Registries:
        """The registries, calling only the registration hooks of ``kinds`` not yet called.

        Looking up a pipeline must not import the placement policies or the
        transports: `omni config` stays fast.
        """
        if self._registries is None:
            self._registries = _Registries(
                by_plugin={name: {kind: [] for kind in _KINDS} for name in self.records}
            )
        reg = self._registries
        for kind in kinds:
            if kind not in reg.collected:
                reg.collected.add(kind)
                self._collect(reg, kind)
        return reg

    def _collect(self, reg: _Registries, kind: str) -> None:
        plugin_names = {id(r.plugin): r.name for r in self.records.values() if r.plugin is not None}
        spec = _KINDS[kind]
        table = getattr(reg, spec.attribute)
        # get_hookimpls() is in registration order (pluggy *calls* them LIFO): a
        # clash is blamed on the plugin that came second, never the established one.
        for impl in getattr(self.pm.hook, spec.hook).get_hookimpls():
            owner = plugin_names.get(id(impl.plugin), impl.plugin_name)
            try:
                items = [(_item_name(item, spec), item) for item in impl.function() or []]
            except Exception as exc:  # one bad plugin must not hide the others
                reg.errors.setdefault(owner, f"{spec.hook} failed: {describe(exc)}")
                continue
            for name, item in items:
                self._put(reg, table, kind, name, item, owner)

    def _put(self, reg: _Registries, table: dict, kind: str, name: str, item: Any, owner: str):
        label = _KINDS[kind].singular
        names = [name]
        if kind == "pipelines":
            names += [a for a in getattr(item, "aliases", ()) if a != name]
        for key in names:
            other = table.get(key) or (
                table.get(reg.aliases[key]) if kind == "pipelines" and key in reg.aliases else None
            )
            if other is not None and other.plugin != owner:
                message = (
                    f"{label} {key!r} is registered by two plugins: {other.plugin!r} and "
                    f"{owner!r}; uninstall one, or restrict which load with OMNI_PLUGINS"
                )
                reg.conflicts.setdefault(kind, []).append(message)
                reg.errors.setdefault(owner, message)
                return
        table[name] = Registered(name, item, owner)
        reg.by_plugin[owner][kind].append(name)
        if kind == "pipelines":
            for alias in names[1:]:
                reg.aliases[alias] = name

    def _raise_conflicts(self, kind: str) -> None:
        conflicts = self._registry(kind).conflicts.get(kind)
        if conflicts:
            raise PluginError("\n".join(conflicts))

    def pipelines(self) -> dict[str, Registered]:
        self._raise_conflicts("pipelines")
        return dict(self._registry("pipelines").pipelines)

    def pipeline(self, name: str) -> type:
        """The pipeline class registered under ``name`` or one of its aliases."""
        self._raise_conflicts("pipelines")
        reg = self._registry("pipelines")
        canonical = reg.aliases.get(name, name)
        if canonical in reg.pipelines:
            return self._pipeline_class(reg, canonical)
        folded = {k.lower(): k for k in [*reg.pipelines, *reg.aliases]}
        if name.lower() in folded:
            key = folded[name.lower()]
            return self._pipeline_class(reg, reg.aliases.get(key, key))
        raise PluginError(
            f"no plugin provides a pipeline called {name!r}",
            hint=self._missing_hint(name, reg.pipelines, "registered pipelines"),
        )

    @staticmethod
    def _pipeline_class(reg: _Registries, name: str) -> type:
        """The class registered as ``name``, imported now if it was registered lazily."""
        registered = reg.pipelines[name]
        if isinstance(registered.value, LazyPipeline):
            loaded = registered.value.load(registered.plugin)
            reg.pipelines[name] = Registered(name, loaded, registered.plugin)
            return loaded
        return registered.value

    def pipeline_classes(self) -> dict[str, type]:
        """Every registered pipeline's class, by name (imports the lazily registered ones)."""
        reg = self._registry("pipelines")
        return {name: self._pipeline_class(reg, name) for name in self.pipelines()}

    def policy(self, name: str) -> Any:
        return self._lookup(name, "placement_policies")

    def transport(self, name: str) -> Any:
        return self._lookup(name, "transports")

    def launcher(self, name: str) -> Any:
        return self._lookup(name, "launchers")

    def _lookup(self, name: str, kind: str) -> Any:
        self._raise_conflicts(kind)
        spec = _KINDS[kind]
        table = getattr(self._registry(kind), spec.attribute)
        if name in table:
            return table[name].value
        raise PluginError(
            f"no plugin provides a {spec.singular} called {name!r}",
            hint=self._missing_hint(name, table, f"registered {spec.plural}"),
        )

    def _missing_hint(self, name: str, table: Iterable[str], kind: str) -> str:
        hint = suggestion(name, table, kind=kind)
        broken = {r.name: r.error for r in self.records.values() if r.error}
        broken.update({n: e for n, e in self.registries.errors.items() if n not in broken})
        if broken:
            hint += "; these plugins failed to load and may provide it: " + "; ".join(
                f"{plugin} ({error})" for plugin, error in broken.items()
            )
        if self.unknown_requested:
            hint += f"; {ENV_VAR} names plugins that are not installed: " + ", ".join(
                self.unknown_requested
            )
        return hint

    # -- listing -----------------------------------------------------------
    def listing(self, *, include_builtin: bool = False) -> list[dict[str, Any]]:
        reg = self.registries
        rows = []
        for record in self.records.values():
            if record.builtin and not include_builtin:
                continue
            made = reg.by_plugin.get(record.name, {})
            rows.append(
                {
                    "name": record.name,
                    "version": record.version,
                    "builtin": record.builtin,
                    "hooks": self.hooks_of(record),
                    "pipelines": made.get("pipelines", []),
                    "placement_policies": made.get("placement_policies", []),
                    "transports": made.get("transports", []),
                    "launchers": made.get("launchers", []),
                    "error": record.error or reg.errors.get(record.name),
                }
            )
        return rows

    def wire_types(self) -> set[str]:
        """Every class the plugins allow in messages between processes, as ``module:Qualname``."""
        from .wire import type_name

        names: set[str] = set()
        owners = {id(r.plugin): r.name for r in self.records.values() if r.plugin is not None}
        for impl in self.pm.hook.omni_register_wire_types.get_hookimpls():
            try:
                names.update(type_name(item) for item in impl.function() or [])
            except Exception as exc:
                owner = owners.get(id(impl.plugin), impl.plugin_name)
                raise PluginError(
                    f"plugin {owner!r}: omni_register_wire_types failed: {describe(exc)}",
                    hint="return classes, or strings 'module:Qualname'",
                ) from None
        return names

    # -- stage construction (child process) ------------------------------
    def build_stage(self, stage: Any, pipeline: Any, context: Any) -> Any:
        return self.pm.hook.omni_build_stage(stage=stage, pipeline=pipeline, context=context)


def _ep_key(ep: metadata.EntryPoint) -> tuple[str, str]:
    return (ep.dist.name if ep.dist else "", ep.name)


def _item_name(item: Any, kind: _Kind) -> str:
    attr = kind.name_attribute
    name = getattr(item, attr, "")
    if not name or not isinstance(name, str):
        raise PluginError(f"a plugin registered a {kind.singular} without a {attr}: {item!r}")
    if kind.attribute == "pipelines":
        aliases = getattr(item, "aliases", ())
        if not isinstance(aliases, (tuple, list)) or not all(isinstance(a, str) for a in aliases):
            raise PluginError(
                f"pipeline {name!r}: aliases must be a tuple of names, not {aliases!r}",
                hint=f'write aliases = ("{aliases}",)' if isinstance(aliases, str) else None,
            )
    return name


def _requested(value: str | None) -> set[str] | None:
    if value is None:
        return None
    return {_normalise(part.strip()) for part in value.split(",") if part.strip()}


_current: OmniPlugins | None = None


def get_plugins(factory: Callable[[], OmniPlugins] = OmniPlugins) -> OmniPlugins:
    """The process-wide plugin manager, loaded on first use."""
    global _current
    if _current is None:
        _current = factory()
    return _current


def reset_plugins() -> None:
    """Forget the process-wide manager (tests; a changed ``OMNI_PLUGINS``)."""
    global _current
    _current = None
