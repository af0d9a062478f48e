"""omni: plugin-based serving of multi-stage omni-modal model pipelines.

The public surface is small: the hook markers, the schema a pipeline is
declared with, and the plugin manager. Nothing here imports an ML framework.
"""

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
