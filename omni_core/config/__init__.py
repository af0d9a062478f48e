"""Deployment configuration: the path language, sources, resolution, provenance.

Depends on the schema and the plugin manager only; knows nothing of planning
or the runtime.
"""

from .file_source import DeployFile
from .load import load_deployment
from .origin import Layer, Origin, Patch, Rank
from .paths import PathError, PathSchema
from .resolve import PathRecord, Resolution, resolve

__all__ = [
    "DeployFile",
    "Layer",
    "Origin",
    "Patch",
    "PathError",
    "PathRecord",
    "PathSchema",
    "Rank",
    "Resolution",
    "load_deployment",
    "resolve",
]
