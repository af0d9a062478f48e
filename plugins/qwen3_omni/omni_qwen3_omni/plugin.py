"""Entry point of omni-qwen3-omni: registers its three pipelines with omni
and estimates their memory (the kit's hooks, :class:`omni_core.kit.plugin.ModelPlugin`)."""

from __future__ import annotations

from omni_core import LazyPipeline
from omni_core.kit.plugin import ModelPlugin

MODULE = "omni_qwen3_omni.pipeline"
# The checkpoint's model_type and architecture: a model_path of a Qwen3-Omni
# checkpoint selects the speech pipeline.
CHECKPOINT_NAMES = ("qwen3_omni_moe", "Qwen3OmniMoeForConditionalGeneration")

PLUGIN = ModelPlugin(
    [
        LazyPipeline(
            "qwen3-omni",
            f"{MODULE}:Qwen3OmniSpeechPipeline",
            (*CHECKPOINT_NAMES, "Qwen3OmniSpeechPipelineConfig"),
        ),
        LazyPipeline(
            "qwen3-omni-colocated",
            f"{MODULE}:Qwen3OmniColocatedPipeline",
            ("Qwen3OmniSpeechColocatedPipelineConfig",),
        ),
        LazyPipeline(
            "qwen3-omni-text", f"{MODULE}:Qwen3OmniTextPipeline", ("Qwen3OmniTextPipelineConfig",)
        ),
    ],
    memory="omni_qwen3_omni.memory:estimate",
)
omni_register_pipelines = PLUGIN.omni_register_pipelines
omni_estimate_memory = PLUGIN.omni_estimate_memory
