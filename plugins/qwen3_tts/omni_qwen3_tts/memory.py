"""GPU memory estimates for Qwen3-TTS, for the ``auto`` placement policy.

Weights are counted from the architecture (the checkpoint's ``config.json``
when ``model_path`` is a local directory, else the known 0.6B / 1.7B shapes
picked by the model name) and sized by the stage's ``factory.dtype``. The
engine's KV budget is ``engine.max_total_tokens`` tokens (the engine
backend's default when unset) of the talker's cache, in the same dtype; the
code predictor's cache is rebuilt every frame and is
counted in the overhead. Approximate by design: norms and biases are left
out, and the overhead figures are round allowances for activations and CUDA
graphs. The vocoder's weights are counted exactly from its speech tokenizer's
config (``codec_params.py``; a hub id: the release's), and its overhead from its codec's geometry
(``codec_footprint.py``): its chunks' activations, its streams' state and
its CUDA graphs, by its factory's chunking and batch. Declare
``total_reserve_bytes`` on a stage to replace its estimate.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from omni_core.kit.memory import by_stage, max_positions, section
from omni_core.placement import MemoryEstimate
from omni_core.plan.estimates import (
    GiB,
    decoder_params,
    engine_estimate,
    shape_from_config,
)

from .codec_footprint import CodecFootprint, decoder_footprint, vocoder_estimate
from .codec_params import speech_decoder_params, speech_encoder_params
from .config import DecoderConfig, SpeechTokenizerConfig
from .source import SOURCE

TALKERS: dict[str, dict[str, int]] = {
    "0.6B": dict(
        layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=3072
    ),
    "1.7B": dict(
        layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, intermediate=6144, vocab=3072
    ),
}
PREDICTOR = dict(
    layers=5, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=2048
)
TEXT_VOCAB = 151936
TEXT_HIDDEN = 2048
CODEBOOKS = 16
#: The release's 12 Hz tokenizer, encoder and decoder (``codec_params.py`` counts
#: 170,557,441 from its config: its 682 MB of float32 safetensors)
SPEECH_TOKENIZER_PARAMS = 170_557_441
ENGINE_OVERHEAD = 1 * GiB

_SIZE = re.compile(r"(0\.6B|1\.7B)", re.IGNORECASE)


def talker_shapes(model_path: str) -> tuple[dict[str, int], dict[str, int], str] | None:
    """(talker, code predictor, source) from a local config or the model name."""
    config = SOURCE.local_config(model_path)  # a preset's too (download-free)
    size = _SIZE.search(model_path or "")
    fallback = TALKERS[size.group(1).upper()] if size else None
    if config is not None:
        talker_cfg = config.get("talker_config", config)
        base = fallback or TALKERS["0.6B"]
        talker = shape_from_config(talker_cfg, base)
        predictor = shape_from_config(talker_cfg.get("code_predictor_config"), PREDICTOR)
        return talker, predictor, f"{model_path}/config.json"
    if fallback is None:
        return None
    return dict(fallback), dict(PREDICTOR), f"Qwen3-TTS {size.group(1).upper()} architecture"  # type: ignore[union-attr]


def engine_params(
    talker: dict[str, int],
    predictor: dict[str, int],
    text_vocab: int = TEXT_VOCAB,
    text_hidden: int = TEXT_HIDDEN,
) -> int:
    """Talker (with its codec embedding and head), text path, and code predictor."""
    params = decoder_params(**talker, tied_embeddings=False)
    params += text_vocab * text_hidden + text_hidden * text_hidden + text_hidden * talker["hidden"]
    predictor_layers = decoder_params(**{**predictor, "vocab": 0})
    heads_and_embeddings = 2 * (CODEBOOKS - 1) * predictor["vocab"] * predictor["hidden"]
    params += predictor_layers + heads_and_embeddings
    if talker["hidden"] != predictor["hidden"]:
        params += talker["hidden"] * predictor["hidden"]  # small_to_mtp_projection
    return params


def estimate(pipeline: Any) -> dict[str, MemoryEstimate]:
    """Estimates for the GPU stages of a Qwen3-TTS deployment (by stage name)."""
    shapes = talker_shapes(pipeline.model_path)

    def engine(stage: Any) -> MemoryEstimate | None:
        if shapes is None:
            return None
        talker, predictor, source = shapes
        config = SOURCE.local_config(pipeline.model_path)
        text = section(config, "talker_config") or {}
        params = engine_params(
            talker,
            predictor,
            int(text.get("text_vocab_size", TEXT_VOCAB)),
            int(text.get("text_hidden_size", TEXT_HIDDEN)),
        )
        longest = max_positions(config, "talker_config", default=32768)
        overhead = ENGINE_OVERHEAD
        return engine_estimate(
            stage, params, talker, source=source, overhead_bytes=overhead, max_positions=longest
        )

    return by_stage(
        pipeline,
        {
            "tts_engine": engine,
            "vocoder": lambda stage: codec_estimate(
                stage, pipeline.model_path, feeder(pipeline, "tts_engine")
            ),
        },
    )


def codec_config(model_path: str) -> SpeechTokenizerConfig | None:
    """The speech tokenizer's geometry from a preset's or a local checkpoint's
    ``speech_tokenizer/config.json``; None without one (a hub id: the release's)."""
    preset = SOURCE.preset(model_path or "")
    root = SOURCE.presets_dir / preset if preset else Path(model_path or "").expanduser()
    try:
        raw = json.loads((root / "speech_tokenizer" / "config.json").read_text(encoding="utf-8"))
        return SpeechTokenizerConfig.from_dict(raw)
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return None  # no config, or a bad one: the stage refuses that at load, saying why


def codec_decoder_config(model_path: str) -> DecoderConfig:
    """The decoder's geometry (:func:`codec_config`), else the release's footprint: the
    defaults, whose transformer is wider than the release's 512 but whose stream state
    and chunks, all the footprint reads, are the release's."""
    found = codec_config(model_path)
    return found.decoder if found is not None else DecoderConfig()


def vocoder(
    stage: Any, cfg: DecoderConfig, engine: Any = None, params: int = SPEECH_TOKENIZER_PARAMS
) -> MemoryEstimate:
    """The codec's weights (``params``: encoder and decoder, both kept in the process),
    and what its chunks, streams and graphs keep (by its factory; a stream for each
    request ``engine``, the stage that feeds it, runs)."""

    def footprint(itemsize: int) -> CodecFootprint:
        return decoder_footprint(cfg, cfg.latent_dim, 2 * cfg.codebook_dim, itemsize)

    return vocoder_estimate(stage, params, "12 Hz speech tokenizer", footprint, engine)


def codec_estimate(stage: Any, model_path: str, engine: Any = None) -> MemoryEstimate:
    """:func:`vocoder` for the checkpoint at ``model_path``: its tokenizer's weights counted
    from its config (``codec_params.py``), the release's without one."""
    found = codec_config(model_path)
    if found is None:
        return vocoder(stage, DecoderConfig(), engine)
    params = speech_decoder_params(found.decoder) + speech_encoder_params(found.encoder)
    return vocoder(stage, found.decoder, engine, params)


def feeder(pipeline: Any, name: str) -> Any:
    """The pipeline's stage ``name`` (the engine that feeds a vocoder), or None."""
    return next((s for s in pipeline.stages if s.name == name), None)
