"""``code2wav_config``: the geometry of Qwen3-Omni's codec decoder.

Defaults are the reference constructor's (``Qwen3OmniMoeCode2WavConfig``),
so a tiny test config may leave keys out; keys the release adds that the
decoder does not use (``num_semantic_quantizers``, ``model_type``) are
ignored. Field names are the ones the shared codec modules of
``omni_qwen3_tts.speech_tokenizer.decoder`` read, which is what lets one
implementation serve both checkpoints. Constraints are checked here, naming
the key, so a config the model cannot run fails at load.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from omni_qwen3_tts.config import DecoderConfig

from ..config import ConfigError

SAMPLE_RATE = 24_000  # the release's output rate (not in its config)


@dataclass(frozen=True)
class Code2WavConfig(DecoderConfig):
    """Codes ``[num_quantizers]`` per frame -> ``total_upsample`` samples of 24 kHz audio.

    The geometry is Qwen3-TTS's codec decoder's (:class:`DecoderConfig`, whose
    defaults are this release's too), plus the one key only code2wav has;
    parsing and checks are code2wav's own (its config's errors name
    ``code2wav_config``).
    """

    max_position_embeddings: int = 8000

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Code2WavConfig:
        """Parse a root ``config.json`` (``code2wav_config`` inside) or the section itself."""
        section = raw.get("code2wav_config", raw)
        if not isinstance(section, dict):
            raise ConfigError("config.json: code2wav_config must be an object")
        names = {f.name for f in dataclasses.fields(cls)}
        picked = {k: v for k, v in section.items() if k in names and v is not None}
        for key in ("upsample_rates", "upsampling_ratios"):
            if key in picked:
                picked[key] = tuple(int(v) for v in picked[key])
        rope = section.get("rope_scaling") or section.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise ConfigError("code2wav_config.rope_scaling must be an object")
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise ConfigError(
                f"code2wav_config.rope_scaling.rope_type {kind!r} is not supported "
                "(only default rotary positions)"
            )
        if "rope_theta" not in picked and rope.get("rope_theta") is not None:
            picked["rope_theta"] = rope["rope_theta"]
        if "rope_theta" in picked:
            picked["rope_theta"] = float(picked["rope_theta"])
        cfg = cls(**picked)
        cfg.validate()
        return cfg

    def validate(self, where: str = "code2wav_config") -> None:
        positive = (
            "codebook_size",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "sliding_window",
            "intermediate_size",
            "num_hidden_layers",
            "num_quantizers",
            "decoder_dim",
        )
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{where}.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_act != "silu":
            raise ConfigError(f"{where}.hidden_act: only 'silu' is supported")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{where}: hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_attention_heads ({self.num_attention_heads}) when head_dim is not given"
            )
        if self.attn_head_dim % 2:
            raise ConfigError(f"{where}: the head size ({self.attn_head_dim}) must be even (RoPE)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{where}: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        for name in ("upsample_rates", "upsampling_ratios"):
            if any(int(r) < 1 for r in getattr(self, name)):
                raise ConfigError(f"{where}.{name} must be positive, got {getattr(self, name)}")
        if not self.upsample_rates:
            raise ConfigError(f"{where}.upsample_rates must not be empty")
        halvings = 2 ** len(self.upsample_rates)
        if self.decoder_dim % halvings:
            raise ConfigError(
                f"{where}.decoder_dim ({self.decoder_dim}) must be divisible by "
                f"2**len(upsample_rates) = {halvings} (each decoder block halves it)"
            )
        # Streaming crops a new stream's lead within its first frame (see model.py).
        per_frame, lead = math.prod(self.upsampling_ratios), 0
        for rate in self.upsample_rates:
            per_frame, lead = per_frame * rate, lead * rate + rate
            if lead >= per_frame:
                raise ConfigError(
                    f"{where}: upsample_rates {list(self.upsample_rates)} with "
                    f"upsampling_ratios {list(self.upsampling_ratios)} trim a frame's worth "
                    "of samples or more; a frame would decode to no audio"
                )
