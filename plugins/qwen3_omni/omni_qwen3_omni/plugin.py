"""Entry point of omni-qwen3-omni: registers its three pipelines with omni."""

from __future__ import annotations

from omni_core import hookimpl


@hookimpl
def omni_register_pipelines():
    from .pipeline import (
        Qwen3OmniColocatedPipeline,
        Qwen3OmniSpeechPipeline,
        Qwen3OmniTextPipeline,
    )

    return [Qwen3OmniSpeechPipeline, Qwen3OmniColocatedPipeline, Qwen3OmniTextPipeline]
