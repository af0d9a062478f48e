"""Typed views of a Qwen3-Omni ``config.json`` (the thinker half: encoders and decoder).

The release nests everything under ``thinker_config`` (``audio_config``,
``vision_config``, ``text_config``), ``talker_config`` and
``code2wav_config``. We parse the thinker's sections into frozen dataclasses
with the reference's constructor defaults, so model code reads attributes
and a tiny test config may leave keys out. Both spellings transformers has
used are accepted (``rope_scaling`` / ``rope_parameters``, ``num_experts`` /
``num_local_experts``). Constraints the model code relies on are checked
here, naming the key, so a bad checkpoint fails at load with a reason rather
than with a shape error deep in a forward pass.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from omni_core.kit.config import known_fields as _pick  # this plugin's name for it

MODEL_TYPE = "qwen3_omni_moe"


class ConfigError(ValueError):
    """A config.json the model code cannot run."""


@dataclass(frozen=True)
class AudioEncoderConfig:
    """The audio tower (``thinker.audio_tower``): Whisper-style mel in, thinker width out."""

    num_mel_bins: int = 128
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    d_model: int = 1280
    activation_function: str = "gelu"
    scale_embedding: bool = False
    max_source_positions: int = 1500
    n_window: int = 50
    output_dim: int = 3584
    n_window_infer: int = 800
    conv_chunksize: int = 500
    downsample_hidden_size: int = 480

    def validate(self, where: str = "thinker_config.audio_config") -> None:
        if self.d_model % self.encoder_attention_heads:
            raise ConfigError(
                f"{where}: d_model ({self.d_model}) must be a multiple of "
                f"encoder_attention_heads ({self.encoder_attention_heads})"
            )
        if self.activation_function not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
            raise ConfigError(
                f"{where}.activation_function {self.activation_function!r} is not supported"
            )
        window = self.n_window * 2
        if self.n_window_infer % window:
            raise ConfigError(
                f"{where}: n_window_infer ({self.n_window_infer}) must be a multiple of "
                f"2 * n_window ({window})"
            )


@dataclass(frozen=True)
class VisionEncoderConfig:
    """The vision tower (``thinker.visual``): Conv3d patches, ViT blocks, 2x2 merge, deepstack."""

    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def validate(self, where: str = "thinker_config.vision_config") -> None:
        if self.hidden_size % self.num_heads or self.head_dim % 4:
            raise ConfigError(
                f"{where}: hidden_size ({self.hidden_size}) / num_heads ({self.num_heads}) "
                "must be a whole head_dim that is a multiple of 4 (2D rotary positions)"
            )
        side = math.isqrt(self.num_position_embeddings)
        if side * side != self.num_position_embeddings:
            raise ConfigError(
                f"{where}.num_position_embeddings ({self.num_position_embeddings}) must be a "
                "perfect square (a grid of learned positions)"
            )
        bad = [i for i in self.deepstack_visual_indexes if not 0 <= i < self.depth]
        if bad:
            raise ConfigError(
                f"{where}.deepstack_visual_indexes {list(bad)} must be block indexes < depth "
                f"({self.depth})"
            )


@dataclass(frozen=True)
class TextConfig:
    """The thinker's Qwen3-MoE decoder (``thinker.model`` and ``thinker.lm_head``)."""

    vocab_size: int = 152064
    hidden_size: int = 2048
    intermediate_size: int = 768
    num_hidden_layers: int = 48
    num_attention_heads: int = 32
    num_key_value_heads: int = 4
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 65536
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    mrope_section: tuple[int, ...] = (24, 20, 20)
    mrope_interleaved: bool = True
    attention_bias: bool = False
    decoder_sparse_step: int = 1
    moe_intermediate_size: int = 768
    num_experts_per_tok: int = 8
    num_experts: int = 128
    norm_topk_prob: bool = True
    mlp_only_layers: tuple[int, ...] = ()
    tie_word_embeddings: bool = False

    def is_moe_layer(self, layer: int) -> bool:
        """The reference's rule: sparse unless listed dense, every ``decoder_sparse_step``-th."""
        return (
            layer not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def validate(self, where: str = "thinker_config.text_config") -> None:
        if self.hidden_act != "silu":
            raise ConfigError(f"{where}.hidden_act: only 'silu' is supported")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{where}: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        if sum(self.mrope_section) * 2 != self.head_dim:
            raise ConfigError(
                f"{where}.rope_scaling.mrope_section {list(self.mrope_section)} must sum to "
                f"head_dim/2 ({self.head_dim // 2})"
            )
        if len(self.mrope_section) != 3:
            raise ConfigError(f"{where}.rope_scaling.mrope_section must have 3 entries")
        if not 0 < self.num_experts_per_tok <= max(self.num_experts, 1):
            raise ConfigError(
                f"{where}: num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                f"1..num_experts ({self.num_experts})"
            )


@dataclass(frozen=True, kw_only=True)
class PlaceholderIds:
    """The thinker's placeholder ids (``thinker_config``): positions holding them take
    an encoder's output, so the thinker and the talker both read them ("multimodal").
    The reference constructor's defaults; the release's config.json sets
    ``audio_token_id`` 151675."""

    audio_token_id: int = 151646
    image_token_id: int = 151655
    video_token_id: int = 151656

    @property
    def multimodal_ids(self) -> frozenset[int]:
        return frozenset((self.audio_token_id, self.image_token_id, self.video_token_id))


@dataclass(frozen=True)
class ThinkerConfig(PlaceholderIds):
    """Everything the understanding half needs: the three towers and the special ids."""

    audio: AudioEncoderConfig
    vision: VisionEncoderConfig
    text: TextConfig
    # The reference constructor's defaults (the release's config.json sets
    # audio_start_token_id 151669, position_id_per_seconds 13).
    audio_start_token_id: int = 151647
    vision_start_token_id: int = 151652
    user_token_id: int = 872
    position_id_per_seconds: int = 25

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ThinkerConfig:
        """Parse a root ``config.json`` (``thinker_config`` inside) or a thinker section."""
        section = raw.get("thinker_config", raw)
        if not isinstance(section, dict):
            raise ConfigError("config.json: thinker_config must be an object")
        audio = AudioEncoderConfig(**_pick(AudioEncoderConfig, section.get("audio_config") or {}))
        vision_raw = dict(section.get("vision_config") or {})
        if "deepstack_visual_indexes" in vision_raw:
            vision_raw["deepstack_visual_indexes"] = tuple(vision_raw["deepstack_visual_indexes"])
        vision = VisionEncoderConfig(**_pick(VisionEncoderConfig, vision_raw))
        text = _text_config(section.get("text_config") or {})
        for part, where in (
            (audio, "thinker_config.audio_config"),
            (vision, "thinker_config.vision_config"),
            (text, "thinker_config.text_config"),
        ):
            part.validate(where)
        for name, width in (
            ("audio_config.output_dim", audio.output_dim),
            ("vision_config.out_hidden_size", vision.out_hidden_size),
        ):
            if width != text.hidden_size:
                raise ConfigError(
                    f"thinker_config.{name} ({width}) must equal text_config.hidden_size "
                    f"({text.hidden_size}): encoder outputs replace token embeddings"
                )
        ids = _pick(cls, section)
        ids.pop("audio", None), ids.pop("vision", None), ids.pop("text", None)
        if "tie_word_embeddings" in section and "tie_word_embeddings" not in (
            section.get("text_config") or {}
        ):
            text = dataclasses.replace(
                text, tie_word_embeddings=bool(section["tie_word_embeddings"])
            )
        return cls(audio=audio, vision=vision, text=text, **ids)


def _text_config(raw: dict[str, Any]) -> TextConfig:
    picked = _pick(TextConfig, raw, aliases={"num_local_experts": "num_experts"})
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "mrope"):
        raise ConfigError(
            f"thinker_config.text_config.rope_scaling.rope_type {kind!r} is not supported "
            "(only default multimodal rotary positions)"
        )
    if rope.get("mrope_section") is not None:
        picked["mrope_section"] = tuple(int(s) for s in rope["mrope_section"])
    for key in ("interleaved", "mrope_interleaved"):
        if rope.get(key) is not None:
            picked["mrope_interleaved"] = bool(rope[key])
    if raw.get("rope_theta") is None and rope.get("rope_theta") is not None:
        picked["rope_theta"] = float(rope["rope_theta"])
    if "mlp_only_layers" in picked:
        picked["mlp_only_layers"] = tuple(picked["mlp_only_layers"])
    if raw.get("head_dim") is None and raw.get("hidden_size") and raw.get("num_attention_heads"):
        picked["head_dim"] = int(raw["hidden_size"]) // int(raw["num_attention_heads"])
    return TextConfig(**picked)
