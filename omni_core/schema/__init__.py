"""The typed shape of a pipeline and its deployment settings."""

from .deployment import (
    ClusterConfig,
    EndpointsConfig,
    NodeConfig,
    PlacementConfig,
    ProcessConfig,
    RayConfig,
    RuntimeConfig,
    ServerConfig,
)
from .groups import (
    PLACEMENT_OWNED_FACTORY_KEYS,
    DType,
    EngineArgs,
    FactoryArgs,
    LoadFormat,
    Quantization,
    SettingsGroup,
)
from .pipeline import PipelineConfig
from .sizes import format_bytes, parse_bytes
from .stage import AUTHOR_ONLY_FIELDS, EngineStageConfig, StageConfig
from .validation import validation_message

__all__ = [
    "AUTHOR_ONLY_FIELDS",
    "PLACEMENT_OWNED_FACTORY_KEYS",
    "ClusterConfig",
    "DType",
    "EndpointsConfig",
    "EngineArgs",
    "EngineStageConfig",
    "FactoryArgs",
    "LoadFormat",
    "NodeConfig",
    "PipelineConfig",
    "PlacementConfig",
    "ProcessConfig",
    "Quantization",
    "RayConfig",
    "RuntimeConfig",
    "ServerConfig",
    "SettingsGroup",
    "StageConfig",
    "format_bytes",
    "parse_bytes",
    "validation_message",
]
