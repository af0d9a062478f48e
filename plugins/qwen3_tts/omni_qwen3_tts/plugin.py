"""Entry point of omni-qwen3-tts: registers its pipeline with omni and estimates its memory."""

from __future__ import annotations

from omni_core import hookimpl


@hookimpl
def omni_register_pipelines():
    from .pipeline import Qwen3TTSPipeline

    return [Qwen3TTSPipeline]


@hookimpl
def omni_estimate_memory(pipeline):
    from .pipeline import Qwen3TTSPipeline

    if not isinstance(pipeline, Qwen3TTSPipeline):
        return None
    from .memory import estimate

    return estimate(pipeline)


@hookimpl
def omni_register_wire_types():
    """The payload classes that cross between stages when they run in different processes."""
    return ["omni_qwen3_tts.prompt:TTSPrompt"]
