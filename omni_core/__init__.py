"""omni: plugin-based serving of multi-stage omni-modal model pipelines.

The public surface is small: the hook markers, the schema a pipeline is
declared with, and the plugin manager. Nothing here imports an ML framework.
"""

from typing import TYPE_CHECKING, Any

# Exported name -> the submodule that defines it. Imported on first access
# (PEP 562), so `omni config` and `omni plugins list` do not pay for the
# factory, the transports or every pydantic model just by importing a submodule.
_EXPORTS = {
    "ConfigError": "errors",
    "NotImplementedYet": "errors",
    "OmniError": "errors",
    "PluginError": "errors",
    "RequestError": "errors",
    "UsageError": "errors",
    "StageContext": "factory",
    "hookimpl": "hookspecs",
    "hookspec": "hookspecs",
    "PlacementPolicy": "placement",
    "LazyPipeline": "lazy_pipeline",
    "OmniPlugins": "plugins",
    "get_plugins": "plugins",
    "reset_plugins": "plugins",
    "EngineArgs": "schema",
    "EngineStageConfig": "schema",
    "FactoryArgs": "schema",
    "PipelineConfig": "schema",
    "ProcessConfig": "schema",
    "StageConfig": "schema",
    "Channel": "transport",
    "Transport": "transport",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # what type checkers and IDEs see
    from .errors import (
        ConfigError,
        NotImplementedYet,
        OmniError,
        PluginError,
        RequestError,
        UsageError,
    )
    from .factory import StageContext
    from .hookspecs import hookimpl, hookspec
    from .lazy_pipeline import LazyPipeline
    from .placement import PlacementPolicy
    from .plugins import OmniPlugins, get_plugins, reset_plugins
    from .schema import (
        EngineArgs,
        EngineStageConfig,
        FactoryArgs,
        PipelineConfig,
        ProcessConfig,
        StageConfig,
    )
    from .transport import Channel, Transport

__version__ = "0.1.0"

__all__ = [
    "Channel",
    "ConfigError",
    "EngineArgs",
    "EngineStageConfig",
    "FactoryArgs",
    "LazyPipeline",
    "NotImplementedYet",
    "OmniError",
    "OmniPlugins",
    "PipelineConfig",
    "PlacementPolicy",
    "PluginError",
    "ProcessConfig",
    "RequestError",
    "StageConfig",
    "StageContext",
    "Transport",
    "UsageError",
    "__version__",
    "get_plugins",
    "hookimpl",
    "hookspec",
    "reset_plugins",
]
