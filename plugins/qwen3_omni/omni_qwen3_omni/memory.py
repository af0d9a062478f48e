"""GPU memory estimates for the Qwen3-Omni pipelines, for the ``auto`` placement policy.

Each GPU stage loads one part of the checkpoint (``thinker.`` model and
towers, ``talker.``, ``code2wav.``), so each is sized from its own
architecture: the checkpoint's ``config.json`` sections when ``model_path``
is a local directory, else the 30B-A3B shapes below. Weights by the stage's
``factory.dtype``; engine stages add a KV cache, in the same dtype, of
``engine.max_total_tokens`` tokens (the engine backend's default when unset).
Approximate by design (norms, biases and small
projections left out; overheads are round allowances). Declare
``total_reserve_bytes`` on a stage to replace its estimate.
"""

from __future__ import annotations

from typing import Any

from omni_core.kit.memory import by_stage, config_shapes, max_positions, weights_only
from omni_core.placement import MemoryEstimate
from omni_core.plan.estimates import GiB, MiB, decoder_params, encoder_params, engine_estimate
from omni_qwen3_tts.codec_footprint import CodecFootprint, decoder_footprint, vocoder_estimate
from omni_qwen3_tts.codec_params import codec_decoder_params

from .code2wav.config import Code2WavConfig
from .source import SOURCE

THINKER = dict(
    layers=48,
    hidden=2048,
    heads=32,
    kv_heads=4,
    head_dim=128,
    experts=128,
    moe_intermediate=768,
    vocab=152064,
)
AUDIO_TOWER = dict(layers=32, hidden=1280, intermediate=5120)
AUDIO_OUT = 2048
VISION_TOWER = dict(layers=27, hidden=1152, intermediate=4304)
VISION_MERGE = 4  # spatial merge 2x2
DEEPSTACK_MERGERS = 3
TALKER = dict(
    layers=20,
    hidden=1024,
    heads=16,
    kv_heads=2,
    head_dim=128,
    experts=128,
    moe_intermediate=384,
    shared_expert_intermediate=768,
    vocab=3072,
)
PREDICTOR = dict(layers=5, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072)
CODEBOOKS = 16
CODEBOOK_SIZE = 2048
ENGINE_OVERHEAD = 2 * GiB
ENCODER_OVERHEAD = 1 * GiB
AGGREGATE_OVERHEAD = 256 * MiB  # mm_aggregate holds no weights, only merged embeddings
ARCHITECTURE = "Qwen3-Omni-30B-A3B architecture"


def _vision_params(shape: dict[str, int], out: int) -> int:
    merged = shape["hidden"] * VISION_MERGE
    merger = merged * merged + merged * out
    return encoder_params(**shape) + (1 + DEEPSTACK_MERGERS) * merger


def estimate(pipeline: Any) -> dict[str, MemoryEstimate]:
    """Estimates for the GPU stages of a Qwen3-Omni deployment (by stage name)."""
    (thinker, audio, vision, talker, predictor), source = config_shapes(
        pipeline.model_path,
        ARCHITECTURE,
        [
            (("thinker_config", "text_config"), THINKER),
            (("thinker_config", "audio_config"), AUDIO_TOWER),
            (("thinker_config", "vision_config"), VISION_TOWER),
            (("talker_config", "text_config"), TALKER),
            (("talker_config", "code_predictor_config"), PREDICTOR),
        ],
        read=SOURCE.local_config,
    )
    out = thinker["hidden"]
    talker_params = decoder_params(**talker, tied_embeddings=False)
    talker_params += 2 * (out * out + out * talker["hidden"])  # text and hidden projections
    talker_params += decoder_params(**predictor)
    talker_params += 2 * (CODEBOOKS - 1) * CODEBOOK_SIZE * predictor["hidden"]

    config = SOURCE.local_config(pipeline.model_path)
    longest = {  # our configs' defaults where the file says nothing
        "thinker": max_positions(config, "thinker_config", "text_config", default=65536),
        "talker_ar": max_positions(config, "talker_config", "text_config", default=32768),
    }

    def engine(shape: dict[str, int], params: int, name: str) -> Any:
        return lambda stage: engine_estimate(
            stage,
            params,
            shape,
            source=source,
            overhead_bytes=ENGINE_OVERHEAD,
            max_positions=longest[name],
        )

    def encoder(params: int) -> Any:
        return lambda stage: weights_only(stage, params, overhead=ENCODER_OVERHEAD, label=source)

    return by_stage(
        pipeline,
        {
            "thinker": engine(thinker, decoder_params(**thinker, tied_embeddings=False), "thinker"),
            "talker_ar": engine(talker, talker_params, "talker_ar"),
            "audio_encoder": encoder(encoder_params(**audio) + audio["hidden"] * out),
            "image_encoder": encoder(_vision_params(vision, out)),
            "mm_aggregate": lambda _: MemoryEstimate(0, 0, AGGREGATE_OVERHEAD, "no weights"),
            "code2wav": lambda stage: vocoder_estimate(
                stage,
                code2wav_params(config),
                "code2wav decoder",
                code2wav_footprint(config),
                next((s for s in pipeline.stages if s.name == "talker_ar"), None),
            ),
        },
    )


def code2wav_config(config: Any) -> Code2WavConfig:
    """The checkpoint's code2wav section (the release's without one, or with a bad one:
    the stage refuses that at load, with the reason)."""
    try:
        return Code2WavConfig.from_dict(config) if isinstance(config, dict) else Code2WavConfig()
    except ValueError:
        return Code2WavConfig()


def code2wav_params(config: Any) -> int:
    """code2wav's weights: a codec decoder body at its hidden width (no projections) and its
    code table of ``codebook_size x num_quantizers`` rows (216 M at the release's size)."""
    cfg = code2wav_config(config)
    table = cfg.codebook_size * cfg.num_quantizers * cfg.hidden_size
    return codec_decoder_params(cfg, cfg.hidden_size, projected=False) + table


def code2wav_footprint(config: Any) -> Any:
    """``footprint(itemsize)`` of the checkpoint's code2wav (the release's without one)."""
    cfg = code2wav_config(config)

    def footprint(itemsize: int) -> CodecFootprint:
        return decoder_footprint(cfg, cfg.hidden_size, 0, itemsize)

    return footprint
