"""Entry point of omni-moss-tts: registers its pipeline with omni and estimates its memory."""

from __future__ import annotations

from omni_core import hookimpl


@hookimpl
def omni_register_pipelines():
    from .pipeline import MossTTSPipeline

    return [MossTTSPipeline]


@hookimpl
def omni_estimate_memory(pipeline):
    from .pipeline import MossTTSPipeline

    if not isinstance(pipeline, MossTTSPipeline):
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
