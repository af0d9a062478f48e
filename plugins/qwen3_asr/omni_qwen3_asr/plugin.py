"""Entry point of omni-qwen3-asr: registers the ``qwen3-asr`` pipeline with omni."""

from __future__ import annotations

from omni_core import LazyPipeline
from omni_core.kit.plugin import ModelPlugin

# A model_path of a Qwen3-ASR checkpoint selects the pipeline by these names.
CHECKPOINT_NAMES = ("qwen3_asr", "Qwen3ASRForConditionalGeneration")

PLUGIN = ModelPlugin(
    [LazyPipeline("qwen3-asr", "omni_qwen3_asr.pipeline:Qwen3ASRPipeline", CHECKPOINT_NAMES)],
    memory="omni_qwen3_asr.memory:estimate",
)
omni_register_pipelines = PLUGIN.omni_register_pipelines
omni_estimate_memory = PLUGIN.omni_estimate_memory
