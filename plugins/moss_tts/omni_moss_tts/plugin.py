"""Entry point of omni-moss-tts: registers its pipeline with omni and estimates its memory."""

from __future__ import annotations

import sys

from omni_core import LazyPipeline, hookimpl

PIPELINE_MODULE = "omni_moss_tts.pipeline"


@hookimpl
def omni_register_pipelines():
    # By name: only the pipeline a command uses is imported (see omni_qwen3_tts's).
    aliases = ("moss_tts", "moss_tts_delay", "MossTTSDelayModel", "MossTTSPipelineConfig")
    return [LazyPipeline("moss-tts", f"{PIPELINE_MODULE}:MossTTSPipeline", aliases)]


@hookimpl
def omni_estimate_memory(pipeline):
    module = sys.modules.get(PIPELINE_MODULE)  # not imported: not one of ours
    if module is None or not isinstance(pipeline, module.MossTTSPipeline):
        return None
    from .memory import estimate

    return estimate(pipeline)


@hookimpl
def omni_register_wire_types():
    """The payload classes that cross between stages when they run in different processes."""
    return [
        "omni_moss_tts.prompt:MossPrompt",
        "omni_moss_tts.model:TextSampling",
        "omni_moss_tts.model:RequestPrompt",
    ]
