"""A model plugin's entry-point hooks, declared as data (torch-free).

Every model plugin's entry-point module answers the same three hooks the
same way: its pipelines by name (:class:`~omni_core.LazyPipeline`, so a
command imports only the pipeline it uses), a memory estimate for its own
pipelines only, and the payload classes its stages send between processes.
A plugin states those facts once::

    PLUGIN = ModelPlugin(
        [LazyPipeline("my-tts", "my_tts.pipeline:MyTTSPipeline", ("my_tts",))],
        memory="my_tts.memory:estimate",
        wire_types=["my_tts.prompt:MyPrompt"],
    )
    omni_register_pipelines = PLUGIN.omni_register_pipelines
    omni_estimate_memory = PLUGIN.omni_estimate_memory
    omni_register_wire_types = PLUGIN.omni_register_wire_types

The module stays the entry point (pluggy finds the three hooks on it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from ..hookspecs import hookimpl
from ..lazy_pipeline import LazyPipeline


class ModelPlugin:
    """The hooks of one model plugin: ``pipelines``, ``memory`` (``"module:function"``
    taking the pipeline) and ``wire_types`` (``"module:Qualname"`` strings)."""

    def __init__(
        self,
        pipelines: Sequence[LazyPipeline],
        *,
        memory: str | None = None,
        wire_types: Sequence[str] = (),
    ):
        self.pipelines = list(pipelines)
        self.memory = memory
        self.wire_types = list(wire_types)

    def owns(self, pipeline: Any) -> bool:
        """Whether ``pipeline`` is an instance of one of these classes.

        A class whose module was never imported cannot have instances, so
        nothing is imported to answer (another plugin's pipeline costs nothing).
        """
        for lazy in self.pipelines:
            module_name, _, qualname = lazy.target.partition(":")
            module = sys.modules.get(module_name)
            cls = getattr(module, qualname, None) if module is not None else None
            if isinstance(cls, type) and isinstance(pipeline, cls):
                return True
        return False

    @hookimpl
    def omni_register_pipelines(self) -> list[LazyPipeline]:
        return list(self.pipelines)

    @hookimpl
    def omni_estimate_memory(self, pipeline: Any) -> Any:
        if self.memory is None or not self.owns(pipeline):
            return None
        from ..factory import import_object

        return import_object(self.memory, what="a plugin's memory estimate")(pipeline)

    @hookimpl
    def omni_register_wire_types(self) -> list[str]:
        return list(self.wire_types)
