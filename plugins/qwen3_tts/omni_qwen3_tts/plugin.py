"""Entry point of omni-qwen3-tts: registers its pipeline with omni."""

from __future__ import annotations

from omni_core import hookimpl


@hookimpl
def omni_register_pipelines():
    from .pipeline import Qwen3TTSPipeline

    return [Qwen3TTSPipeline]
