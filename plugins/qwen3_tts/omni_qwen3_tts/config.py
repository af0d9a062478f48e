"""Typed views of the Qwen3-TTS configuration files.

A checkpoint carries three JSON documents: the root ``config.json`` (talker,
code predictor, speaker encoder, special token ids), ``generation_config.json``
(sampling defaults) and ``speech_tokenizer/config.json`` (the 12 Hz codec: a
Mimi encoder and our decoder). We parse them into frozen dataclasses with the
release's defaults, so that model code reads attributes instead of dict keys
and a missing key falls back to what the reference would have used.
Keys we do not model are ignored: we only read configs, never write them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omni_core.kit.config import FromDict, TTSTextIds, known_fields, token_ids
from omni_core.kit.config import rope_theta as _rope_theta
from omni_core.kit.config import rope_type as _rope_type

MODEL_TYPE = "qwen3_tts"
SPEECH_TOKENIZER_TYPE = "qwen3_tts_tokenizer_12hz"
VARIANTS = ("base", "custom_voice", "voice_design")


@dataclass(frozen=True)
class TransformerConfig:
    """Geometry of one Qwen3-style decoder stack (talker or code predictor)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    hidden_act: str = "silu"
    num_code_groups: int = 16
    max_position_embeddings: int = 32768

    def validate(self, where: str) -> None:
        if self.hidden_act != "silu":
            raise ValueError(
                f"{where}.hidden_act: only 'silu' is supported, got {self.hidden_act!r}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"{where}: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"{where}.head_dim must be even for rotary positions")


def transformer_config(
    raw: dict[str, Any],
    defaults: dict[str, Any],
    where: str,
    *,
    rope_types: tuple[str, ...] = ("default",),
) -> TransformerConfig:
    """One Qwen3 decoder stack's geometry from a config section, ``defaults`` filling gaps.

    Shared by every family built on it (MOSS-TTS's backbone, Qwen3-Omni's code
    predictor too). The rotary base is read from the section itself under
    either spelling before the defaults, so a transformers-5 ``rope_parameters``
    is not shadowed by a default. ``rope_types``: the rotary variants the
    caller's release writes for this stack (the positions are the same).
    """
    merged = {**defaults, **{k: v for k, v in raw.items() if v is not None}}
    heads = int(merged["num_attention_heads"])
    head_dim = merged.get("head_dim") or int(merged["hidden_size"]) // heads
    kv_heads = merged.get("num_key_value_heads") or heads
    if _rope_type(raw) not in rope_types:
        raise ValueError(
            f"{where}: rope type {_rope_type(raw)!r} is not supported "
            f"(only {', '.join(rope_types)})"
        )
    cfg = TransformerConfig(
        vocab_size=int(merged["vocab_size"]),
        hidden_size=int(merged["hidden_size"]),
        intermediate_size=int(merged["intermediate_size"]),
        num_hidden_layers=int(merged["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(kv_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(merged.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(raw, defaults.get("rope_theta", 10000.0)),
        attention_bias=bool(merged.get("attention_bias", False)),
        hidden_act=str(merged.get("hidden_act", "silu")),
        num_code_groups=int(merged.get("num_code_groups", 16)),
        max_position_embeddings=int(merged.get("max_position_embeddings", 32768)),
    )
    cfg.validate(where)
    return cfg


# The reference's constructor defaults (configuration_qwen3_tts.py). Real
# checkpoints spell out every value; the defaults only matter for tiny configs.
# Qwen3-Omni's code predictor has the same (Qwen3OmniMoeTalkerCodePredictorConfig).
PREDICTOR_DEFAULTS: dict[str, Any] = {
    "vocab_size": 2048,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "num_code_groups": 32,
}
# Qwen3-Omni's talker decoder has the same (Qwen3OmniMoeTalkerTextConfig).
TALKER_DEFAULTS: dict[str, Any] = {
    "vocab_size": 3072,
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "num_hidden_layers": 20,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "num_code_groups": 32,
}


@dataclass(frozen=True, kw_only=True)
class TalkerCodecIds:
    """Codebook-0 control ids of a Qwen talker: codec pad/bos/eos and the think markers.

    Qwen3-Omni's talker has these with the same defaults (its reference
    constructor's, as here); keyword-only, so a talker config inherits them
    after its own positional fields.
    """

    codec_eos_token_id: int = 4198
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197


@dataclass(frozen=True, kw_only=True)
class CodecIds(TalkerCodecIds):
    """Qwen3-TTS's control ids: the shared ones and ``codec_think_id`` (the prefix that
    names a language is think, think_bos, language, think_eos)."""

    codec_think_id: int = 4202


@dataclass(frozen=True)
class TalkerConfig(CodecIds):
    """The talker: decoder stack plus the text path and codec vocabulary ids."""

    transformer: TransformerConfig
    code_predictor: TransformerConfig
    text_vocab_size: int
    text_hidden_size: int
    mrope_section: tuple[int, ...] | None
    mrope_interleaved: bool
    spk_id: dict[str, int]
    spk_is_dialect: dict[str, str | bool]
    codec_language_id: dict[str, int]

    @property
    def num_code_groups(self) -> int:
        return self.transformer.num_code_groups

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TalkerConfig:
        transformer = transformer_config(raw, TALKER_DEFAULTS, "talker_config")
        predictor = transformer_config(
            raw.get("code_predictor_config") or {},
            PREDICTOR_DEFAULTS,
            "talker_config.code_predictor_config",
        )
        if predictor.num_code_groups != transformer.num_code_groups:
            raise ValueError(
                "talker_config.code_predictor_config.num_code_groups "
                f"({predictor.num_code_groups}) must equal talker_config.num_code_groups "
                f"({transformer.num_code_groups})"
            )
        rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
        section = rope.get("mrope_section")
        if section is not None and sum(section) * 2 != transformer.head_dim:
            raise ValueError(
                f"talker_config.rope_scaling.mrope_section {section} must sum to head_dim/2 "
                f"({transformer.head_dim // 2})"
            )
        return cls(
            transformer=transformer,
            code_predictor=predictor,
            text_vocab_size=int(raw.get("text_vocab_size", 151936)),
            text_hidden_size=int(raw.get("text_hidden_size", 2048)),
            mrope_section=tuple(int(s) for s in section) if section is not None else None,
            mrope_interleaved=bool(rope.get("interleaved", False)),
            **token_ids(CodecIds, raw),
            spk_id={str(k).lower(): int(v) for k, v in (raw.get("spk_id") or {}).items()},
            spk_is_dialect={
                str(k).lower(): v for k, v in (raw.get("spk_is_dialect") or {}).items()
            },
            codec_language_id={
                str(k).lower(): int(v) for k, v in (raw.get("codec_language_id") or {}).items()
            },
        )


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """ECAPA-TDNN speaker encoder of the Base variant (x-vector for voice cloning)."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SpeakerEncoderConfig:
        known = known_fields(cls, raw)
        for key in ("enc_channels", "enc_kernel_sizes", "enc_dilations"):
            if key in known:
                known[key] = tuple(int(v) for v in known[key])
        cfg = cls(**known)
        if not (len(cfg.enc_channels) == len(cfg.enc_kernel_sizes) == len(cfg.enc_dilations)):
            raise ValueError(
                "speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations "
                "must have the same length"
            )
        return cfg


@dataclass(frozen=True)
class Qwen3TTSConfig(TTSTextIds):
    """The root ``config.json``: variant, talker, speaker encoder, text special ids (the kit's
    :class:`~omni_core.kit.config.TTSTextIds`)."""

    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig
    tts_model_type: str
    tts_model_size: str | None
    tokenizer_type: str | None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def has_speaker_encoder(self) -> bool:
        return self.tts_model_type == "base"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Qwen3TTSConfig:
        model_type = raw.get("model_type", MODEL_TYPE)
        if model_type != MODEL_TYPE:
            raise ValueError(f"config.json: model_type is {model_type!r}, expected {MODEL_TYPE!r}")
        variant = raw.get("tts_model_type")
        if variant not in VARIANTS:
            raise ValueError(
                f"config.json: tts_model_type is {variant!r}; expected one of {', '.join(VARIANTS)}"
            )
        tokenizer_type = raw.get("tokenizer_type")
        if tokenizer_type not in (None, SPEECH_TOKENIZER_TYPE):
            raise ValueError(
                f"config.json: tokenizer_type {tokenizer_type!r} is not supported "
                f"(only {SPEECH_TOKENIZER_TYPE!r}, the 12 Hz codec)"
            )
        return cls(
            talker=TalkerConfig.from_dict(raw.get("talker_config") or {}),
            speaker_encoder=SpeakerEncoderConfig.from_dict(raw.get("speaker_encoder_config") or {}),
            tts_model_type=variant,
            tts_model_size=raw.get("tts_model_size"),
            tokenizer_type=tokenizer_type,
            **token_ids(TTSTextIds, raw),
            raw=raw,
        )


@dataclass(frozen=True)
class GenerationDefaults(FromDict):
    """``generation_config.json``: the release's sampling defaults (talker and sub-talker)."""

    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9
    max_new_tokens: int = 2048
    min_new_tokens: int = 2


@dataclass(frozen=True)
class DecoderConfig:
    """The speech-tokenizer decoder (codes -> 24 kHz waveform)."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 1024
    latent_dim: int = 1024
    head_dim: int | None = None
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    rope_theta: float = 10000.0

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def total_upsample(self) -> int:
        total = 1
        for rate in (*self.upsample_rates, *self.upsampling_ratios):
            total *= rate
        return total

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DecoderConfig:
        known = known_fields(cls, raw)
        for key in ("upsample_rates", "upsampling_ratios"):
            if key in known:
                known[key] = tuple(int(v) for v in known[key])
        known["rope_theta"] = _rope_theta(raw, 10000.0)
        cfg = cls(**known)
        if cfg.decoder_dim % (2 ** len(cfg.upsample_rates)):
            raise ValueError(
                "speech_tokenizer decoder_config.decoder_dim must be divisible by "
                f"2**len(upsample_rates) = {2 ** len(cfg.upsample_rates)}"
            )
        if cfg.codebook_dim % 2:
            raise ValueError("speech_tokenizer decoder_config.codebook_dim must be even")
        return cfg


@dataclass(frozen=True)
class EncoderConfig:
    """The Mimi encoder of the speech tokenizer (24 kHz waveform -> codes), for voice cloning.

    Key names follow transformers' ``MimiConfig``; defaults are its defaults.
    """

    sampling_rate: int = 24000
    frame_rate: float = 12.5
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    trim_right_ratio: float = 1.0
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    upsample_groups: int = 512
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    hidden_act: str = "gelu"
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    use_cache: bool = False
    sliding_window: int = 250
    attention_bias: bool = False
    layer_scale_initial_scale: float = 0.01

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def encoder_frame_rate(self) -> float:
        hop = 1
        for ratio in self.upsampling_ratios:
            hop *= ratio
        return self.sampling_rate / hop

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EncoderConfig:
        known = known_fields(cls, raw)
        if "upsampling_ratios" in known:
            known["upsampling_ratios"] = tuple(int(v) for v in known["upsampling_ratios"])
        known["rope_theta"] = _rope_theta(raw, 10000.0)
        cfg = cls(**known)
        if cfg.audio_channels != 1:
            raise ValueError("speech_tokenizer encoder_config.audio_channels must be 1")
        if not cfg.use_causal_conv:
            raise ValueError("speech_tokenizer encoder_config.use_causal_conv must be true")
        return cfg


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    """``speech_tokenizer/config.json``: the 12 Hz codec (encoder and decoder)."""

    encoder: EncoderConfig
    decoder: DecoderConfig
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SpeechTokenizerConfig:
        model_type = raw.get("model_type", SPEECH_TOKENIZER_TYPE)
        if model_type != SPEECH_TOKENIZER_TYPE:
            raise ValueError(
                f"speech_tokenizer/config.json: model_type is {model_type!r}, "
                f"expected {SPEECH_TOKENIZER_TYPE!r}"
            )
        decoder = DecoderConfig.from_dict(raw.get("decoder_config") or {})
        cfg = cls(
            encoder=EncoderConfig.from_dict(raw.get("encoder_config") or {}),
            decoder=decoder,
            encoder_valid_num_quantizers=int(raw.get("encoder_valid_num_quantizers", 16)),
            input_sample_rate=int(raw.get("input_sample_rate", 24000)),
            output_sample_rate=int(raw.get("output_sample_rate", 24000)),
            decode_upsample_rate=int(raw.get("decode_upsample_rate", 1920)),
            encode_downsample_rate=int(raw.get("encode_downsample_rate", 1920)),
            raw=raw,
        )
        if decoder.total_upsample != cfg.decode_upsample_rate:
            raise ValueError(
                "speech_tokenizer/config.json: decode_upsample_rate "
                f"({cfg.decode_upsample_rate}) differs from the decoder's total upsampling "
                f"({decoder.total_upsample})"
            )
        return cfg
