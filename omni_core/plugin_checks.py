"""What pluggy leaves to its caller: unknown hooks, and errors told in one line.

pluggy accepts a ``@hookimpl`` whose name matches no hookspec (the spec might
be added later) and complains only if someone calls ``check_pending()``, for
the whole manager at once. omni declares every hook up front, so an unknown
hook is a plugin author's mistake (``omni_register_pipeline``, singular): it
is reported as *that* plugin's load error, naming the closest real hook, and
every other plugin loads as usual. A hook meant for another version of omni
opts out with ``@hookimpl(optionalhook=True)``, as pluggy documents.
"""

from __future__ import annotations

import pluggy

from .errors import did_you_mean
from .hookspecs import PROJECT_NAME


def hook_names(pm: pluggy.PluginManager) -> list[str]:
    """The hooks ``pm`` has a specification for."""
    return sorted(
        name
        for name, caller in vars(pm.hook).items()
        if not name.startswith("_") and caller.has_spec()
    )


def unknown_hooks(pm: pluggy.PluginManager, plugin: object) -> list[str]:
    """The hooks ``plugin`` (registered in ``pm``) implements that no hookspec declares."""
    unknown = []
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.has_spec():
            continue
        mine = [impl for impl in caller.get_hookimpls() if impl.plugin is plugin]
        if any(not impl.optionalhook for impl in mine):
            unknown.append(caller.name)
    return sorted(unknown)


def unknown_hooks_message(names: list[str], known: list[str]) -> str:
    """``omni_register_pipeline is not an omni hook; did you mean omni_register_pipelines?``"""
    parts = []
    for name in names:
        close = did_you_mean(name, known)
        if close:
            parts.append(f"{name} is not an {PROJECT_NAME} hook; did you mean {close}?")
        else:
            parts.append(
                f"{name} is not an {PROJECT_NAME} hook (the hooks: {', '.join(known)}; "
                "mark it @hookimpl(optionalhook=True) if it is meant for another version)"
            )
    return "; ".join(parts)


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line; a pydantic error as its problems, by location."""
    errors = getattr(exc, "errors", None)
    title = getattr(exc, "title", None)
    if callable(errors) and title is not None:  # pydantic.ValidationError, without importing it
        try:
            problems = [
                f"{'.'.join(map(str, e.get('loc', ()))) or '(value)'}: {e.get('msg', '')}"
                for e in errors()
            ]
        except Exception:  # not pydantic's after all: fall back to its text
            problems = []
        if problems:
            return f"{type(exc).__name__} in {title}: " + "; ".join(problems)
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
