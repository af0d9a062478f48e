"""Entry point of omni-qwen3-tts: registers its pipeline with omni and estimates its memory."""

from __future__ import annotations

import sys

from omni_core import LazyPipeline, hookimpl

PIPELINE_MODULE = "omni_qwen3_tts.pipeline"


@hookimpl
def omni_register_pipelines():
    # By name: every omni command collects all pipelines, and only the one it
    # uses is imported (the names must match the class's; omni checks on load).
    aliases = ("qwen3_tts", "Qwen3TTSForConditionalGeneration", "Qwen3TTSPipelineConfig")
    return [LazyPipeline("qwen3-tts", f"{PIPELINE_MODULE}:Qwen3TTSPipeline", aliases)]


@hookimpl
def omni_estimate_memory(pipeline):
    module = sys.modules.get(PIPELINE_MODULE)  # not imported: not one of ours
    if module is None or not isinstance(pipeline, module.Qwen3TTSPipeline):
        return None
    from .memory import estimate

    return estimate(pipeline)


@hookimpl
def omni_register_wire_types():
    """The payload classes that cross between stages when they run in different processes."""
    return ["omni_qwen3_tts.prompt:TTSPrompt"]
