"""Typed view of ``talker_config`` (plus the root and thinker ids the talker reads).

The talker is its own small MoE decoder (``text_config``) with a code
predictor (``code_predictor_config``) hanging off it. Building its input also
needs ids that live outside ``talker_config``: the ChatML and role ids and the
``tts_*`` text ids at the root of ``config.json``, and the thinker's media
placeholder ids (the release marks multimodal positions with the thinker's
ids, not the talker's copies). :meth:`TalkerConfig.from_dict` therefore takes
the root ``config.json``.

Defaults are the reference constructors' (a tiny test config may leave keys
out); both spellings transformers has used are accepted (``rope_scaling`` /
``rope_parameters``, ``num_experts`` / ``num_local_experts``). What the model
code relies on is checked here, naming the key, so a bad checkpoint fails at
load rather than with a shape error in the middle of a request.

Two release quirks are mirrored on purpose: every talker layer is sparse
(the release overwrites the dense/sparse choice, so ``mlp_only_layers`` and
``decoder_sparse_step`` are read by nobody), and the talker's rotary tables
are always interleaved whatever ``interleaved`` says.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from omni_core.errors import RequestError
from omni_core.kit.config import TTSTextIds, token_ids
from omni_qwen3_tts.config import (
    PREDICTOR_DEFAULTS,
    TALKER_DEFAULTS,
    TalkerCodecIds,
    TransformerConfig,
    transformer_config,
)

from ..config import ConfigError, PlaceholderIds, _pick

#: Codebook-0 ids at or above ``vocab_size - CONTROL_IDS`` are control tokens
#: (codec pad/bos/eos, think markers, speakers); only EOS may be generated.
CONTROL_IDS = 1024


# The reference constructor's defaults (Qwen3OmniMoeTalkerTextConfig) for the geometry:
# Qwen3-TTS's talker's (its code groups aside, which TalkerConfig holds here);
# intermediate_size is the dense width the release never uses in a layer: the inner
# width of ``text_projection`` / ``hidden_projection``. head_dim 0: hidden / heads.
_TEXT_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in TALKER_DEFAULTS.items() if k != "num_code_groups"},
    "head_dim": 0,
}


@dataclass(frozen=True)
class TalkerTextConfig(TransformerConfig):
    """``talker.model``: a Qwen3 decoder's geometry (the shared decoder layers take it as
    it is) with M-RoPE sections and mixture-of-experts MLPs."""

    mrope_section: tuple[int, ...] = (24, 20, 20)
    moe_intermediate_size: int = 384
    shared_expert_intermediate_size: int = 0  # required: the reference has no default
    num_experts: int = 128
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = False

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    def validate(self, where: str = "talker_config.text_config") -> None:
        if self.hidden_act != "silu":
            raise ConfigError(f"{where}.hidden_act: only 'silu' is supported")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{where}: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        if len(self.mrope_section) != 3 or sum(self.mrope_section) * 2 != self.head_dim:
            raise ConfigError(
                f"{where}.rope_scaling.mrope_section {list(self.mrope_section)} must be 3 "
                f"entries summing to head_dim/2 ({self.head_dim // 2})"
            )
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(
                f"{where}: num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                f"1..num_experts ({self.num_experts})"
            )
        if self.shared_expert_intermediate_size <= 0:
            raise ConfigError(
                f"{where}.shared_expert_intermediate_size is required (every talker layer has "
                "a gated shared expert of that width)"
            )
        if self.vocab_size <= CONTROL_IDS:
            raise ConfigError(
                f"{where}.vocab_size ({self.vocab_size}) must exceed the {CONTROL_IDS} control ids "
                "at its top"
            )


@dataclass(frozen=True, kw_only=True)
class RootIds(TTSTextIds):
    """The ids the talker reads at the top level of ``config.json``: the kit's ChatML and
    ``tts_*`` ids, and the role words a turn starts with."""

    system_token_id: int = 8948
    user_token_id: int = 872
    assistant_token_id: int = 77091


@dataclass(frozen=True)
class TalkerConfig(PlaceholderIds, TalkerCodecIds, RootIds):
    """The talker, its code predictor, and every id its input and output rules use: its
    codec control ids (Qwen3-TTS's :class:`TalkerCodecIds`), the root ids
    (:class:`RootIds`) and the thinker's placeholder ids (:class:`PlaceholderIds`, read
    from ``thinker_config``)."""

    text: TalkerTextConfig
    code_predictor: TransformerConfig
    thinker_hidden_size: int = 2048
    accept_hidden_layer: int = 18
    num_code_groups: int = 32
    speaker_id: dict[str, int] = field(default_factory=dict)  # lower-case names

    @property
    def tts_special_ids(self) -> tuple[int, int, int]:
        """``(tts_bos, tts_eos, tts_pad)``: the thinker rows a prompt needs (that order)."""
        return (self.tts_bos_token_id, self.tts_eos_token_id, self.tts_pad_token_id)

    @property
    def suppressed_range(self) -> tuple[int, int]:
        """Codebook-0 ids ``[start, stop)`` never generated, except ``codec_eos_token_id``."""
        return self.text.vocab_size - CONTROL_IDS, self.text.vocab_size

    def speaker(self, name: str | int) -> int:
        """The codec id of a speaker, by name (any case) or as an id from the map.

        An unknown one is the client's mistake (RequestError, naming the known ones).
        """
        known = ", ".join(sorted(self.speaker_id)) or "none"
        if isinstance(name, int) and not isinstance(name, bool):
            if name not in self.speaker_id.values():
                raise RequestError(f"unknown speaker id {name} (this model has: {known})")
            return name
        key = str(name).lower()
        if key not in self.speaker_id:
            raise RequestError(
                f"unknown speaker {name!r} (this model has: {known}); map other names to "
                "these with server.voice_aliases, or set server.openai_compat = true for "
                "OpenAI's voice names"
            )
        return self.speaker_id[key]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TalkerConfig:
        """Parse a root ``config.json`` (``talker_config`` and ``thinker_config`` inside)."""
        section = raw.get("talker_config")
        if not isinstance(section, dict):
            raise ConfigError("config.json: talker_config must be an object")
        text = _text_config(section.get("text_config") or {})
        text.validate()
        predictor = _predictor_config(section.get("code_predictor_config") or {})
        picked = _pick(cls, section)
        picked.pop("text", None), picked.pop("code_predictor", None)
        if "speaker_id" in picked:
            picked["speaker_id"] = {str(k).lower(): int(v) for k, v in picked["speaker_id"].items()}
        picked.update(token_ids(RootIds, raw))
        thinker = raw.get("thinker_config") or {}
        for key in ("audio_token_id", "image_token_id", "video_token_id"):
            picked.pop(key, None)  # the talker's own copies are not what the release reads
            if thinker.get(key) is not None:
                picked[key] = int(thinker[key])
        cfg = cls(text=text, code_predictor=predictor, **picked)
        cfg.validate(thinker)
        return cfg

    def validate(self, thinker: dict[str, Any] | None = None) -> None:
        where = "talker_config"
        text, predictor = self.text, self.code_predictor
        if predictor.hidden_size != text.hidden_size:
            raise ConfigError(
                f"{where}.code_predictor_config.hidden_size ({predictor.hidden_size}) must equal "
                f"text_config.hidden_size ({text.hidden_size}): the predictor reads the "
                "talker's hidden state and its code embeddings feed the talker, unprojected"
            )
        if predictor.num_code_groups != self.num_code_groups:
            raise ConfigError(
                f"{where}.code_predictor_config.num_code_groups ({predictor.num_code_groups}) "
                f"must equal {where}.num_code_groups ({self.num_code_groups})"
            )
        if self.num_code_groups < 2:
            raise ConfigError(f"{where}.num_code_groups must be at least 2")
        codebook = text.vocab_size - CONTROL_IDS
        if predictor.vocab_size != codebook:
            raise ConfigError(
                f"{where}.code_predictor_config.vocab_size ({predictor.vocab_size}) must equal "
                f"text_config.vocab_size - {CONTROL_IDS} ({codebook}): every code group shares "
                "one codebook"
            )
        ids = {
            **{f.name: getattr(self, f.name) for f in fields(TalkerCodecIds)},
            **{f"speaker_id.{k}": v for k, v in self.speaker_id.items()},
        }
        bad = [f"{k} ({v})" for k, v in ids.items() if not 0 <= v < text.vocab_size]
        if bad:
            raise ConfigError(
                f"{where}: codec ids outside the codec vocabulary ({text.vocab_size}): "
                + ", ".join(bad)
            )
        if not self.speaker_id:
            raise ConfigError(f"{where}.speaker_id must name at least one speaker")
        thinker_text = (thinker or {}).get("text_config") or {}
        width = thinker_text.get("hidden_size")
        if width is not None and int(width) != self.thinker_hidden_size:
            raise ConfigError(
                f"{where}.thinker_hidden_size ({self.thinker_hidden_size}) must equal "
                f"thinker_config.text_config.hidden_size ({width})"
            )
        layers = thinker_text.get("num_hidden_layers")
        if not 0 <= self.accept_hidden_layer <= (int(layers) if layers is not None else 1 << 30):
            raise ConfigError(
                f"{where}.accept_hidden_layer ({self.accept_hidden_layer}) must name one of the "
                f"thinker's hidden states 0..{layers}"
            )


def _rope(raw: dict[str, Any]) -> dict[str, Any]:
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "mrope"):
        raise ConfigError(
            f"talker_config rope type {kind!r} is not supported (only default rotary positions)"
        )
    return rope


def _text_config(raw: dict[str, Any]) -> TalkerTextConfig:
    aliases = {"num_local_experts": "num_experts"}
    picked = {
        **_TEXT_DEFAULTS,
        **_pick(TalkerTextConfig, raw, aliases, exclude={"num_code_groups"}),
    }
    rope = _rope(raw)
    if rope.get("mrope_section") is not None:
        picked["mrope_section"] = tuple(int(s) for s in rope["mrope_section"])
    if raw.get("rope_theta") is None and rope.get("rope_theta") is not None:
        picked["rope_theta"] = float(rope["rope_theta"])
    return TalkerTextConfig(**picked)


# The reference constructor's defaults (Qwen3OmniMoeTalkerCodePredictorConfig) are
# those of Qwen3-TTS's code predictor, and the geometry is read the same way.
def _predictor_config(raw: dict[str, Any]) -> TransformerConfig:
    where = "talker_config.code_predictor_config"
    _rope(raw)
    if "sliding_attention" in (raw.get("layer_types") or ()):
        # A frame's cache never exceeds num_code_groups positions; rather than
        # reason about windows that small, refuse what the release never uses.
        raise ConfigError(f"{where}.layer_types: sliding-window layers are not supported")
    if raw.get("num_key_value_heads") is None and raw.get("num_attention_heads") is not None:
        raw = {**raw, "num_key_value_heads": raw["num_attention_heads"]}
    try:
        return transformer_config(raw, PREDICTOR_DEFAULTS, where, rope_types=("default", "mrope"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
