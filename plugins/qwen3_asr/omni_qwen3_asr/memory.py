"""GPU memory of the ``asr`` stage, for the ``auto`` placement policy (torch-free).

One stage holds the audio tower and the decoder, so its estimate is both
towers' weights in the stage's ``factory.dtype`` plus the engine's KV cache
(``engine.max_total_tokens``). Sized from the checkpoint's ``config.json``
when ``model_path`` is local, else from Qwen3-ASR-1.7B's shapes.
"""

from __future__ import annotations

from typing import Any

from omni_core.placement import MemoryEstimate
from omni_core.plan.estimates import (
    GiB,
    decoder_params,
    encoder_params,
    engine_estimate,
    read_local_config,
    shape_from_config,
)

DECODER = dict(
    layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, intermediate=6144, vocab=151936
)
AUDIO_TOWER = dict(layers=24, hidden=1024, intermediate=4096)
SOURCE = "Qwen3-ASR-1.7B architecture"


def estimate(pipeline: Any) -> dict[str, MemoryEstimate]:
    config = read_local_config(pipeline.model_path)
    source = f"{pipeline.model_path}/config.json" if config else SOURCE
    thinker = (config or {}).get("thinker_config") or {}
    decoder = shape_from_config(thinker.get("text_config"), DECODER)
    tower = shape_from_config(thinker.get("audio_config"), AUDIO_TOWER)
    params = decoder_params(**decoder, tied_embeddings=False) + encoder_params(**tower)
    return {
        stage.name: engine_estimate(stage, params, decoder, source=source, overhead_bytes=GiB)
        for stage in pipeline.stages
        if stage.name == "asr"
    }
