"""Entry point of omni-qwen3-tts: registers its pipeline with omni and estimates its memory.

The hooks are the kit's (:class:`omni_core.kit.plugin.ModelPlugin`): the
pipeline by name (every omni command collects all pipelines, and only the one
it uses is imported), its memory estimate, and the payload classes that cross
between stages when they run in different processes.
"""

from __future__ import annotations

from omni_core import LazyPipeline
from omni_core.kit.plugin import ModelPlugin

PLUGIN = ModelPlugin(
    [
        LazyPipeline(
            "qwen3-tts",
            "omni_qwen3_tts.pipeline:Qwen3TTSPipeline",
            ("qwen3_tts", "Qwen3TTSForConditionalGeneration", "Qwen3TTSPipelineConfig"),
        )
    ],
    memory="omni_qwen3_tts.memory:estimate",
    wire_types=["omni_qwen3_tts.prompt:TTSPrompt"],
)
omni_register_pipelines = PLUGIN.omni_register_pipelines
omni_estimate_memory = PLUGIN.omni_estimate_memory
omni_register_wire_types = PLUGIN.omni_register_wire_types
