"""Entry point of omni-moss-tts: registers its pipeline with omni."""

from __future__ import annotations

from omni_core import hookimpl


@hookimpl
def omni_register_pipelines():
    from .pipeline import MossTTSPipeline

    return [MossTTSPipeline]
