"""Entry point of omni-qwen3-omni: registers its three pipelines with omni
and estimates their memory."""

from __future__ import annotations

import sys

from omni_core import LazyPipeline, hookimpl

PIPELINE_MODULE = "omni_qwen3_omni.pipeline"
# The checkpoint's model_type and architecture: a model_path of a Qwen3-Omni
# checkpoint selects the speech pipeline.
CHECKPOINT_NAMES = ("qwen3_omni_moe", "Qwen3OmniMoeForConditionalGeneration")


@hookimpl
def omni_register_pipelines():
    # By name: only the pipeline a command uses is imported (the names must
    # match the classes'; omni checks on load).
    module = PIPELINE_MODULE
    return [
        LazyPipeline(
            "qwen3-omni",
            f"{module}:Qwen3OmniSpeechPipeline",
            (*CHECKPOINT_NAMES, "Qwen3OmniSpeechPipelineConfig"),
        ),
        LazyPipeline(
            "qwen3-omni-colocated",
            f"{module}:Qwen3OmniColocatedPipeline",
            ("Qwen3OmniSpeechColocatedPipelineConfig",),
        ),
        LazyPipeline(
            "qwen3-omni-text", f"{module}:Qwen3OmniTextPipeline", ("Qwen3OmniTextPipelineConfig",)
        ),
    ]


@hookimpl
def omni_estimate_memory(pipeline):
    module = sys.modules.get(PIPELINE_MODULE)  # not imported: not one of ours
    owned = (
        ()
        if module is None
        else (
            module.Qwen3OmniSpeechPipeline,
            module.Qwen3OmniColocatedPipeline,
            module.Qwen3OmniTextPipeline,
        )
    )
    if not isinstance(pipeline, owned):
        return None
    from .memory import estimate

    return estimate(pipeline)
