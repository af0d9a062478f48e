"""Entry point of omni-moss-tts: registers its pipeline with omni and estimates its memory.

The hooks are the kit's (:class:`omni_core.kit.plugin.ModelPlugin`).
"""

from __future__ import annotations

from omni_core import LazyPipeline
from omni_core.kit.plugin import ModelPlugin

PLUGIN = ModelPlugin(
    [
        LazyPipeline(
            "moss-tts",
            "omni_moss_tts.pipeline:MossTTSPipeline",
            ("moss_tts", "moss_tts_delay", "MossTTSDelayModel", "MossTTSPipelineConfig"),
        )
    ],
    memory="omni_moss_tts.memory:estimate",
    wire_types=[
        "omni_moss_tts.prompt:MossPrompt",
        "omni_moss_tts.model:TextSampling",
        "omni_moss_tts.model:RequestPrompt",
    ],
)
omni_register_pipelines = PLUGIN.omni_register_pipelines
omni_estimate_memory = PLUGIN.omni_estimate_memory
omni_register_wire_types = PLUGIN.omni_register_wire_types
