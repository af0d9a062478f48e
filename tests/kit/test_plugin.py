"""omni_core.kit.plugin: a model plugin's hooks declared as data, answered through pluggy."""

from __future__ import annotations

import sys
import types
from typing import ClassVar

import pytest

from omni_core import LazyPipeline, PipelineConfig, StageConfig
from omni_core.kit.plugin import ModelPlugin
from omni_core.plugins import OmniPlugins


class KitDemoPipeline(PipelineConfig):
    pipeline_name: ClassVar[str] = "kit-plugin-demo"
    aliases: ClassVar[tuple[str, ...]] = ("kit_demo",)
    entry_stage: ClassVar[str] = "only"
    default_model_path: ClassVar[str] = "x"

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [StageConfig(name="only", factory_path="m:f", terminal=True)]


def estimate(pipeline):
    return {"only": ("estimated", pipeline.pipeline_name)}


@pytest.fixture
def plugin_module(monkeypatch):
    """An entry-point module written the kit's way, with its pipeline and estimate importable."""
    monkeypatch.setitem(sys.modules, "kit_demo_pipeline", sys.modules[__name__])
    plugin = ModelPlugin(
        [LazyPipeline("kit-plugin-demo", "kit_demo_pipeline:KitDemoPipeline", ("kit_demo",))],
        memory="kit_demo_pipeline:estimate",
        wire_types=["kit_demo_pipeline:KitDemoPipeline"],
    )
    module = types.ModuleType("kit_demo_plugin")
    module.omni_register_pipelines = plugin.omni_register_pipelines
    module.omni_estimate_memory = plugin.omni_estimate_memory
    module.omni_register_wire_types = plugin.omni_register_wire_types
    return plugin, module


def test_the_hooks_register_the_pipeline_its_estimate_and_wire_types(plugin_module):
    _, module = plugin_module
    plugins = OmniPlugins(load_entry_points=False)
    with plugins.registered(module, "kit-demo"):
        assert plugins.pipeline("kit_demo") is KitDemoPipeline
        assert "kit_demo_pipeline:KitDemoPipeline" in plugins.wire_types()
        estimated = plugins.pm.hook.omni_estimate_memory(pipeline=KitDemoPipeline())
        assert estimated == {"only": ("estimated", "kit-plugin-demo")}


def test_another_plugins_pipeline_is_not_estimated(plugin_module):
    plugin, _ = plugin_module

    class Other(KitDemoPipeline):
        pass

    assert plugin.owns(Other()) and plugin.omni_estimate_memory(Other()) is not None
    assert not plugin.owns(object()) and plugin.omni_estimate_memory(object()) is None
    unimported = ModelPlugin([LazyPipeline("x", "never_imported_module:X")], memory="m:f")
    assert unimported.omni_estimate_memory(KitDemoPipeline()) is None
    assert "never_imported_module" not in sys.modules
