"""GPU memory of the ``asr`` stage, for the ``auto`` placement policy (torch-free).

One stage holds the audio tower and the decoder, so its estimate is both
towers' weights in the stage's ``factory.dtype`` plus the engine's KV cache
(``engine.max_total_tokens``). Sized from the checkpoint's ``config.json``
when ``model_path`` is local, else from Qwen3-ASR-1.7B's shapes. The ``align``
stage's optional aligner is left out (declare its ``total_reserve_bytes``).
"""

from __future__ import annotations

from typing import Any

from omni_core.kit.memory import by_stage, config_shapes, max_positions
from omni_core.placement import MemoryEstimate
from omni_core.plan.estimates import GiB, decoder_params, encoder_params, engine_estimate

from .source import SOURCE

DECODER = dict(
    layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, intermediate=6144, vocab=151936
)
AUDIO_TOWER = dict(layers=24, hidden=1024, intermediate=4096)


def estimate(pipeline: Any) -> dict[str, MemoryEstimate]:
    (decoder, tower), source = config_shapes(
        pipeline.model_path,
        "Qwen3-ASR-1.7B architecture",
        [
            (("thinker_config", "text_config"), DECODER),
            (("thinker_config", "audio_config"), AUDIO_TOWER),
        ],
        read=SOURCE.local_config,
    )
    params = decoder_params(**decoder, tied_embeddings=False) + encoder_params(**tower)
    config = SOURCE.local_config(pipeline.model_path)
    longest = max_positions(config, "thinker_config", "text_config", default=65536)

    def engine(stage: Any) -> MemoryEstimate:
        return engine_estimate(
            stage, params, decoder, source=source, overhead_bytes=GiB, max_positions=longest
        )

    return by_stage(pipeline, {"asr": engine})
