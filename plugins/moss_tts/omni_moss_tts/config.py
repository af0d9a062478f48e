"""Typed views of a MOSS-TTS checkpoint's ``config.json`` and sampling defaults.

The release (``model_type: moss_tts_delay``) nests the Qwen3 backbone's
settings under ``language_config`` and keeps the delay-pattern ids at the top
level. We parse both into frozen dataclasses with the release's defaults, so
model code reads attributes and a tiny test config may leave keys out.
Torch-free: planning reads these too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_core.kit.config import ChatTokenIds, FromDict, known_fields
from omni_qwen3_tts.config import TransformerConfig, transformer_config

MODEL_TYPE = "moss_tts_delay"

# Qwen3Config's constructor defaults (transformers), for keys a config leaves out.
_QWEN3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
}


def backbone_config(raw: dict[str, Any], where: str) -> TransformerConfig:
    """The ``language_config`` section as the geometry of one Qwen3 decoder stack."""
    merged = {**_QWEN3_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    if merged.get("sliding_window") and merged.get("use_sliding_window"):
        raise ValueError(f"{where}: sliding-window attention is not supported")
    return transformer_config(raw, _QWEN3_DEFAULTS, where)


@dataclass(frozen=True)
class MossTTSConfig(ChatTokenIds):
    """The root ``config.json``: backbone geometry, codebooks and the delay-pattern ids
    (the ChatML markers are the Qwen tokenizer's, the kit's :class:`ChatTokenIds`)."""

    backbone: TransformerConfig
    n_vq: int = 32
    audio_vocab_size: int = 1024
    audio_pad_code: int = 1024
    pad_token_id: int = 151643
    audio_start_token_id: int = 151652
    audio_end_token_id: int = 151653
    audio_user_slot_token_id: int = 151654
    audio_assistant_gen_slot_token_id: int = 151656
    audio_assistant_delay_slot_token_id: int = 151662
    sampling_rate: int = 24000

    @property
    def channels(self) -> int:
        """Ids per sequence position: the text channel and one per codebook."""
        return self.n_vq + 1

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config.json") -> MossTTSConfig:
        model_type = raw.get("model_type", MODEL_TYPE)
        if model_type != MODEL_TYPE:
            raise ValueError(
                f"{where}: model_type is {model_type!r}; omni-moss-tts serves {MODEL_TYPE!r} "
                "(the MOSS-TTS delay-pattern model; MossTTSLocal is a different architecture)"
            )
        language = raw.get("language_config")
        if not isinstance(language, dict):
            raise ValueError(f"{where}: no language_config section (the Qwen3 backbone)")
        known = known_fields(cls, raw, exclude={"backbone"})
        cfg = cls(backbone=backbone_config(language, f"{where}: language_config"), **known)
        cfg.validate(where)
        return cfg

    def validate(self, where: str) -> None:
        if self.n_vq < 1:
            raise ValueError(f"{where}: n_vq must be >= 1, got {self.n_vq}")
        if self.audio_pad_code != self.audio_vocab_size:
            raise ValueError(
                f"{where}: audio_pad_code ({self.audio_pad_code}) must equal audio_vocab_size "
                f"({self.audio_vocab_size}): the audio heads have audio_vocab_size + 1 outputs "
                "and the last one is the pad"
            )
        ids = {
            name: getattr(self, name)
            for name in (
                "pad_token_id",
                "im_start_token_id",
                "im_end_token_id",
                "audio_start_token_id",
                "audio_end_token_id",
                "audio_user_slot_token_id",
                "audio_assistant_gen_slot_token_id",
                "audio_assistant_delay_slot_token_id",
            )
        }
        vocab = self.backbone.vocab_size
        outside = [f"{name} = {value}" for name, value in ids.items() if not 0 <= value < vocab]
        if outside:
            raise ValueError(
                f"{where}: special ids outside the text vocabulary ({vocab}): {', '.join(outside)}"
            )


@dataclass(frozen=True)
class GenerationDefaults(FromDict):
    """Sampling defaults: ``generate()``'s in the release, overridden by ``generation_config.json``.

    Text and audio are sampled with separate parameters. The audio values are
    the model card's recommendation for MossTTSDelay-8B (temperature 1.7,
    top-p 0.8, top-k 25, no repetition penalty); the text head's are
    ``generate()``'s defaults. ``max_new_tokens`` counts audio frames here
    (12.5 per second; the release's counts steps, about one more per frame
    than the 32 of the drain): 4096 is what the release's examples pass.
    """

    text_temperature: float = 1.5
    text_top_p: float = 1.0
    text_top_k: int = 50
    audio_temperature: float = 1.7
    audio_top_p: float = 0.8
    audio_top_k: int = 25
    audio_repetition_penalty: float = 1.0
    max_new_tokens: int = 4096


def backbone_split_sizes(cfg: MossTTSConfig) -> dict[str, int]:
    """What a backbone ``tp_size`` must divide: head counts and the MLP width it slices."""
    b = cfg.backbone
    return {
        "attention heads": b.num_attention_heads,
        "KV heads": b.num_key_value_heads,
        "intermediate_size": b.intermediate_size,
    }
