"""GPU memory estimates for MOSS-TTS, for the ``auto`` placement policy.

The engine is a Qwen3 backbone (8B shapes below, or the checkpoint's
``config.json`` when ``model_path`` is a local directory) with 32 audio
codebook embeddings and heads; the vocoder loads the MOSS audio tokenizer
(1.77B parameters, encoder and decoder, run in float32). Weights
by the stage's ``factory.dtype``; the engine adds a KV cache, in the same
dtype, of ``engine.max_total_tokens`` tokens (the engine backend's default
when unset); the vocoder adds its streams' state and a batch's chunk
(``codec_footprint.py``, at the release codec's size). Approximate by design; declare
``total_reserve_bytes`` on a stage to replace its estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from omni_core.kit.memory import by_stage, max_positions
from omni_core.placement import MemoryEstimate
from omni_core.plan.estimates import (
    GiB,
    decoder_params,
    engine_estimate,
    shape_from_config,
    weights_bytes,
)
from omni_qwen3_tts.codec_footprint import vocoder_estimate

from .codec_footprint import CAPTURED_ROWS, RELEASE_DECODER, codec_footprint
from .source import SOURCE

BACKBONE = dict(
    layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288, vocab=151936
)
AUDIO_CODEBOOKS = 32
AUDIO_VOCAB = 1025  # 1024 entries + pad
CODEC_PARAMS = 1_770_000_000  # the release config.json, counted by our AudioTokenizer
ENGINE_OVERHEAD = 2 * GiB


def backbone_shape(model_path: str) -> tuple[dict[str, int], str]:
    config = SOURCE.local_config(model_path)  # a preset's too: the tiny demo is not 8B
    if config is None:
        return dict(BACKBONE), "MOSS-TTS 8B architecture"
    section = config.get("language_config") or config.get("text_config") or config
    if not isinstance(section, Mapping):
        section = config
    return shape_from_config(section, BACKBONE), f"{model_path}/config.json"


def estimate(pipeline: Any) -> dict[str, MemoryEstimate]:
    """Estimates for the GPU stages of a MOSS-TTS deployment (by stage name)."""

    def engine(stage: Any) -> MemoryEstimate:
        shape, source = backbone_shape(pipeline.model_path)
        params = decoder_params(**shape, tied_embeddings=False)
        params += 2 * AUDIO_CODEBOOKS * AUDIO_VOCAB * shape["hidden"]  # embeddings + heads
        longest = max_positions(
            SOURCE.local_config(pipeline.model_path), "language_config", default=32768
        )
        found = engine_estimate(
            stage,
            params,
            shape,
            source=source,
            overhead_bytes=ENGINE_OVERHEAD,
            max_positions=longest,
        )
        if _shares_codec(pipeline, stage):
            return found
        # the engine encodes reference clips with its own copy of the codec
        return replace(
            found,
            weights_bytes=found.weights_bytes + weights_bytes(CODEC_PARAMS, "float32"),
            source=found.source + " + the codec (1.77B, float32) for voice cloning",
        )

    return by_stage(
        pipeline,
        {
            "tts_engine": engine,
            "vocoder": lambda stage: vocoder_estimate(
                stage,
                CODEC_PARAMS,
                "MOSS audio tokenizer (1.77B)",
                lambda itemsize: codec_footprint(
                    RELEASE_DECODER,
                    itemsize,
                    captured_rows=getattr(stage.factory, "cuda_graph_max_bs", CAPTURED_ROWS),
                ),
                next((s for s in pipeline.stages if s.name == "tts_engine"), None),
                growth=4,
                chunk_memory=None,  # one call a batch (stages.create_vocoder)
            ),
        },
    )


def _shares_codec(pipeline: Any, engine: Any) -> bool:
    """Whether the vocoder's codec is the engine's own (same process and GPU: one copy)."""
    for stage in pipeline.stages:
        if stage.name == "vocoder":
            same_process = pipeline.process_of(stage) == pipeline.process_of(engine)
            # a bf16 vocoder keeps its own copy beside the engine's float32 one
            float32 = getattr(stage.factory, "dtype", None) in (None, "auto", "float32", "fp32")
            return same_process and stage.gpu == engine.gpu and float32
    return False
