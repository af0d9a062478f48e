"""Entry point of omni-qwen3-omni: registers its three pipelines with omni
and estimates their memory."""

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


@hookimpl
def omni_estimate_memory(pipeline):
    from .pipeline import Qwen3OmniColocatedPipeline, Qwen3OmniSpeechPipeline, Qwen3OmniTextPipeline

    owned = (Qwen3OmniSpeechPipeline, Qwen3OmniColocatedPipeline, Qwen3OmniTextPipeline)
    if not isinstance(pipeline, owned):
        return None
    from .memory import estimate

    return estimate(pipeline)
