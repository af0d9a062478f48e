"""A pipeline registered by its names, its class imported only when it is looked up.

``omni_register_pipelines`` may return a pipeline class or a
:class:`LazyPipeline`. Every ``omni`` command collects every plugin's
pipelines (a name registered twice must be refused, naming both plugins),
so returning classes imports every installed pipeline module, and with it
the pydantic models each declares, even for a command about another
pipeline. A ``LazyPipeline`` carries what collection needs, the name and the
aliases, and the class is imported when the pipeline is used.

The names are then written twice, on the class and here. They are checked
against each other when the class is loaded; a mismatch is a
:class:`~omni_core.errors.PluginError` naming the plugin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import OmniError, PluginError


@dataclass(frozen=True)
class LazyPipeline:
    """``pipeline_name`` and ``aliases`` of the class at ``target`` (``"package.module:Class"``)."""

    pipeline_name: str
    target: str
    aliases: tuple[str, ...] = ()

    def load(self, plugin: str) -> type:
        """The class, checked against these names; PluginError naming ``plugin`` otherwise."""
        from .factory import import_object
        from .schema import PipelineConfig

        where = f"plugin {plugin!r} registers pipeline {self.pipeline_name!r} as {self.target!r}"
        try:
            cls: Any = import_object(self.target, what=where)
        except OmniError as exc:
            raise PluginError(exc.message, hint=f"fix or uninstall plugin {plugin!r}") from None
        if not (isinstance(cls, type) and issubclass(cls, PipelineConfig)):
            raise PluginError(f"{where}, which is not a PipelineConfig subclass: {cls!r}")
        mismatches = []
        if cls.pipeline_name != self.pipeline_name:
            mismatches.append(f"pipeline_name {cls.pipeline_name!r}")
        if set(cls.aliases) != set(self.aliases):
            mismatches.append(f"aliases {tuple(cls.aliases)!r} (registered: {self.aliases!r})")
        if mismatches:
            raise PluginError(
                f"{where}, but the class declares " + " and ".join(mismatches),
                hint=f"make plugin {plugin!r}'s LazyPipeline and its class name the same",
            )
        return cls
