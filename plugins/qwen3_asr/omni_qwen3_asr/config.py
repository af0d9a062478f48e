"""A Qwen3-ASR ``config.json`` (``model_type: qwen3_asr``) as the shared parts read it.

The release nests the model under ``thinker_config`` with an ``audio_config``
(the Qwen3-Omni audio tower's design at other sizes) and a ``text_config``
(a dense Qwen3 decoder: the Qwen3-Omni thinker's layers without experts).
So the two sections parse into Qwen3-Omni's own config types: the audio one
as it is, the text one with ``num_experts = 0`` (every layer's feed-forward
is the dense SwiGLU, named ``mlp.{gate,up,down}_proj`` as the release names
it). What is Qwen3-ASR's own is small: the special ids and the languages.

Torch-free, so the parent can read it for memory estimates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omni_core.kit.config import known_fields
from omni_qwen3_omni.config import AudioEncoderConfig, ConfigError, TextConfig, _text_config

MODEL_TYPE = "qwen3_asr"
ARCHITECTURE = "Qwen3ASRForConditionalGeneration"
# The release's generate() stops on either (qwen_asr/core/transformers_backend).
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
DEFAULT_ROPE_THETA = 5_000_000.0  # Qwen3ASRTextConfig's default (Qwen3-Omni's is 1e6)


@dataclass(frozen=True)
class ASRConfig:
    """The audio tower, the decoder and the ids that join them."""

    audio: AudioEncoderConfig
    text: TextConfig
    audio_token_id: int = 151646  # the reference constructor's default; releases set it
    audio_start_token_id: int = 151647
    support_languages: tuple[str, ...] = ()
    # Qwen3-ForcedAligner's checkpoint (same architecture, a classifier head):
    classify_num: int | None = None  # the head's classes (None: the vocabulary, for ASR)
    timestamp_token_id: int | None = None
    timestamp_segment_time: float | None = None  # milliseconds per class

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ASRConfig:
        """Parse a root ``config.json`` (``thinker_config`` inside) or a thinker section."""
        section = raw.get("thinker_config", raw)
        if not isinstance(section, dict):
            raise ConfigError("config.json: thinker_config must be an object")
        audio = AudioEncoderConfig(
            **known_fields(AudioEncoderConfig, section.get("audio_config") or {})
        )
        text_raw = dict(section.get("text_config") or {})
        rope = text_raw.get("rope_scaling") or text_raw.get("rope_parameters") or {}
        if text_raw.get("rope_theta") is None and rope.get("rope_theta") is None:
            text_raw["rope_theta"] = DEFAULT_ROPE_THETA
        # No experts: every layer's feed-forward is the dense SwiGLU.
        text = dataclasses.replace(_text_config(text_raw), num_experts=0, num_experts_per_tok=1)
        if "tie_word_embeddings" not in text_raw and "tie_word_embeddings" in raw:
            text = dataclasses.replace(text, tie_word_embeddings=bool(raw["tie_word_embeddings"]))
        audio.validate("thinker_config.audio_config")
        text.validate("thinker_config.text_config")
        if audio.output_dim != text.hidden_size:
            raise ConfigError(
                f"thinker_config.audio_config.output_dim ({audio.output_dim}) must equal "
                f"text_config.hidden_size ({text.hidden_size}): the tower's rows replace "
                "the audio placeholders' embeddings"
            )
        ids = {
            k: int(section[k]) for k in ("audio_token_id", "audio_start_token_id") if k in section
        }
        if "forced_aligner" in str(section.get("model_type", "")):
            ids["classify_num"] = int(section["classify_num"])
            ids["timestamp_token_id"] = int(raw["timestamp_token_id"])
            ids["timestamp_segment_time"] = float(raw["timestamp_segment_time"])
        languages = tuple(str(x) for x in raw.get("support_languages") or ())
        return cls(audio=audio, text=text, support_languages=languages, **ids)
