"""The MOSS audio tokenizer's ``config.json``, read and checked before any module is built.

Why a parser of our own: the release builds its modules straight from lists
of keyword dictionaries, so a typo or an unsupported option surfaces as a
``TypeError`` deep inside construction, or not at all (a missing
``positional_embedding`` silently selects sinusoidal embeddings there). Here
every key is checked against what our implementation computes, and a refusal
names the key path (``decoder_kwargs[2].num_heads``) and why.

Supported: the layout of the released 24 kHz mono tokenizer that MOSS-TTS
(8B, "delay") uses — 24 kHz, one channel, a residual LFQ of
``num_quantizers`` codebooks (32 x 1024 in the release), causal RoPE
transformers with windowed attention between patch folds. The official
repository also has a 48 kHz stereo "v2" tokenizer, used only by
MossTTSLocal-4B; its configs are refused with a message saying so.

Defaults follow the release's constructors, so a config that leaves a key out
means here what it means there (and a default we do not implement, such as
``causal=False`` or ``positional_embedding="sin"``, is refused by name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SUPPORTED_SAMPLE_RATE = 24000
"""The only rate we build: the tokenizer of MOSS-TTS (8B)."""

_V2_NOTE = (
    "only the 24 kHz mono tokenizer used by MOSS-TTS (8B) is supported; the 48 kHz stereo "
    "'v2' tokenizer of the official repository (used only by MossTTSLocal-4B) is not"
)

_TRANSFORMER_KEYS = {
    "module_type",
    "input_dimension",
    "output_dimension",
    "d_model",
    "num_heads",
    "num_layers",
    "dim_feedforward",
    "causal",
    "norm",
    "positional_embedding",
    "max_period",
    "gating",
    "layer_scale",
    "conv_layout",
    "positional_scale",  # read by the release only for sinusoidal embeddings
    "weights_per_step",
    "weights_per_step_schedule",
}

_QUANTIZER_TYPES = {
    # The release builds the same inference modules for each pair.
    "rlfq": "lfq",
    "random_prefix_rlfq": "lfq",
    "rvq": "vq",
    "spec_rvq": "vq",
}


@dataclass(frozen=True)
class PatchSpec:
    """A fold of ``patch_size`` time steps into channels (encoder) or back (decoder)."""

    patch_size: int


@dataclass(frozen=True)
class TransformerSpec:
    """One causal transformer with input/output projections.

    ``context``: how many positions (itself included) each query attends to,
    derived from the frame rate the transformer runs at; ``rate``: that
    frame rate in Hz.
    """

    input_dimension: int
    output_dimension: int
    d_model: int
    num_heads: int
    num_layers: int
    dim_feedforward: int
    max_period: float
    layer_scale: float | None
    context: int
    rate: float

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


StageSpec = PatchSpec | TransformerSpec


@dataclass(frozen=True)
class QuantizerSpec:
    """Residual quantizer: ``kind`` is ``"lfq"`` (normalised lookup) or ``"vq"`` (plain)."""

    kind: str
    input_dim: int
    rvq_dim: int
    output_dim: int
    num_quantizers: int
    codebook_size: int
    codebook_dim: int


@dataclass(frozen=True)
class CodecConfig:
    """Everything the audio tokenizer's modules are built from."""

    sample_rate: int
    downsample_rate: int
    context_seconds: float
    encoder: tuple[StageSpec, ...]
    quantizer: QuantizerSpec
    decoder: tuple[StageSpec, ...]

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.downsample_rate

    @property
    def num_quantizers(self) -> int:
        return self.quantizer.num_quantizers

    @property
    def codebook_size(self) -> int:
        return self.quantizer.codebook_size

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodecConfig:
        """Parse a release ``config.json`` (as a dict); :class:`ValueError` names any bad key."""
        if not isinstance(d, dict):
            raise ValueError(f"codec config: expected a JSON object, got {type(d).__name__}")
        sample_rate = _sample_rate(d)
        _check_channels(d)
        downsample_rate = _positive_int(d.get("downsample_rate", 1920), "downsample_rate")
        seconds = d.get("causal_transformer_context_duration", 10.0)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ValueError(
                f"causal_transformer_context_duration: expected a positive number of seconds, "
                f"got {seconds!r}"
            )
        seconds = float(seconds)

        rate = float(sample_rate)
        encoder: list[StageSpec] = []
        channels = 1
        for i, raw in enumerate(_stage_list(d, "encoder_kwargs")):
            path = f"encoder_kwargs[{i}]"
            stage = _stage(raw, path, rate, seconds)
            if isinstance(stage, PatchSpec):
                channels *= stage.patch_size
                rate /= stage.patch_size
            else:
                _check_input(stage, channels, path)
                channels = stage.output_dimension
            encoder.append(stage)
        _check_product(encoder, downsample_rate, "encoder_kwargs")

        quantizer = _quantizer(d)
        if quantizer.input_dim != channels:
            raise ValueError(
                f"quantizer_kwargs.input_dim is {quantizer.input_dim} but the encoder ends with "
                f"{channels} channels"
            )

        decoder: list[StageSpec] = []
        channels = quantizer.output_dim
        for i, raw in enumerate(_stage_list(d, "decoder_kwargs")):
            path = f"decoder_kwargs[{i}]"
            stage = _stage(raw, path, rate, seconds)
            if isinstance(stage, PatchSpec):
                if channels % stage.patch_size:
                    raise ValueError(
                        f"{path}.patch_size {stage.patch_size} does not divide the {channels} "
                        "channels it unfolds"
                    )
                channels //= stage.patch_size
                rate *= stage.patch_size
            else:
                _check_input(stage, channels, path)
                channels = stage.output_dimension
            decoder.append(stage)
        _check_product(decoder, downsample_rate, "decoder_kwargs")
        if channels != 1:
            raise ValueError(
                f"decoder_kwargs: the decoder ends with {channels} channels per sample, "
                f"not 1 (mono); {_V2_NOTE}"
            )
        return cls(
            sample_rate=sample_rate,
            downsample_rate=downsample_rate,
            context_seconds=seconds,
            encoder=tuple(encoder),
            quantizer=quantizer,
            decoder=tuple(decoder),
        )


# -- top level -------------------------------------------------------------------


def _sample_rate(d: dict[str, Any]) -> int:
    rates = {k: d[k] for k in ("sampling_rate", "sample_rate") if k in d}
    if len(set(rates.values())) > 1:
        raise ValueError(
            f"sampling_rate ({rates['sampling_rate']!r}) and sample_rate "
            f"({rates['sample_rate']!r}) disagree"
        )
    key, value = next(iter(rates.items())) if rates else ("sampling_rate", 24000)
    rate = _positive_int(value, key)
    if rate != SUPPORTED_SAMPLE_RATE:
        raise ValueError(f"{key} is {rate}: {_V2_NOTE}")
    return rate


def _check_channels(d: dict[str, Any]) -> None:
    for key, value in d.items():
        if "channel" in key.lower() and isinstance(value, int) and value != 1:
            raise ValueError(f"{key} is {value}: {_V2_NOTE}")


def _positive_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{path}: expected a positive integer, got {value!r}")
    return value


def _stage_list(d: dict[str, Any], key: str) -> list[dict[str, Any]]:
    stages = d.get(key)
    if not isinstance(stages, list) or not stages:
        raise ValueError(f"{key}: expected a non-empty list of module settings, got {stages!r}")
    for i, stage in enumerate(stages):
        if not isinstance(stage, dict):
            raise ValueError(f"{key}[{i}]: expected an object, got {stage!r}")
    return stages


def _check_product(stages: list[StageSpec], downsample_rate: int, key: str) -> None:
    sizes = [s.patch_size for s in stages if isinstance(s, PatchSpec)]
    if math.prod(sizes) != downsample_rate:
        raise ValueError(
            f"{key}: the patch sizes {sizes} multiply to {math.prod(sizes)}, "
            f"not downsample_rate {downsample_rate}"
        )


def _check_input(stage: TransformerSpec, channels: int, path: str) -> None:
    if stage.input_dimension != channels:
        raise ValueError(
            f"{path}.input_dimension is {stage.input_dimension} but the module before it "
            f"produces {channels} channels"
        )


# -- stages ----------------------------------------------------------------------


def _stage(raw: dict[str, Any], path: str, rate: float, seconds: float) -> StageSpec:
    kind = raw.get("module_type")
    if kind == "PatchedPretransform":
        extra = sorted(set(raw) - {"module_type", "patch_size"})
        if extra:
            raise ValueError(f"{path}: unknown key(s) for PatchedPretransform: {', '.join(extra)}")
        return PatchSpec(_positive_int(raw.get("patch_size"), f"{path}.patch_size"))
    if kind == "Transformer":
        return _transformer(raw, path, rate, seconds)
    raise ValueError(
        f"{path}.module_type is {kind!r}; supported: 'PatchedPretransform', 'Transformer'"
    )


def _transformer(raw: dict[str, Any], path: str, rate: float, seconds: float) -> TransformerSpec:
    extra = sorted(set(raw) - _TRANSFORMER_KEYS)
    if extra:
        raise ValueError(f"{path}: unknown key(s) for Transformer: {', '.join(extra)}")

    def required(key: str) -> int:
        if key not in raw:
            raise ValueError(f"{path}.{key} is missing")
        return _positive_int(raw[key], f"{path}.{key}")

    def must_be(key: str, default: Any, wanted: Any, why: str) -> None:
        value = raw.get(key, default)
        if value != wanted:
            shown = f"{value!r}" if key in raw else f"missing (the release's default is {value!r})"
            raise ValueError(f"{path}.{key} is {shown}; only {wanted!r} is supported ({why})")

    must_be("causal", False, True, "streaming decode relies on causal attention")
    must_be("norm", "layer_norm", "layer_norm", "the released tokenizer's norm")
    must_be("positional_embedding", "sin", "rope", "the released tokenizer's positions")
    must_be("gating", "none", "none", "the released tokenizer's feed-forward")
    if raw.get("weights_per_step"):
        raise ValueError(f"{path}.weights_per_step is not supported (must be 0 or absent)")
    if raw.get("weights_per_step_schedule") is not None:
        raise ValueError(f"{path}.weights_per_step_schedule is not supported")
    if not isinstance(raw.get("conv_layout", False), bool):
        raise ValueError(f"{path}.conv_layout: expected true or false")

    d_model = required("d_model")
    heads = required("num_heads")
    if d_model % heads:
        raise ValueError(f"{path}: d_model {d_model} is not divisible by num_heads {heads}")
    if (d_model // heads) % 2:
        raise ValueError(
            f"{path}: the head dimension d_model/num_heads = {d_model // heads} must be even "
            "(rotary embedding rotates pairs)"
        )
    max_period = raw.get("max_period", 10000)
    if isinstance(max_period, bool) or not isinstance(max_period, (int, float)) or max_period <= 1:
        raise ValueError(f"{path}.max_period: expected a number > 1, got {max_period!r}")
    layer_scale = raw.get("layer_scale")
    if layer_scale is not None and (
        isinstance(layer_scale, bool) or not isinstance(layer_scale, (int, float))
    ):
        raise ValueError(f"{path}.layer_scale: expected a number or null, got {layer_scale!r}")
    # The release's rule, float arithmetic included, so the windows agree exactly.
    context = int(rate * seconds)
    if context < 1:
        raise ValueError(
            f"{path}: causal_transformer_context_duration {seconds} s gives this transformer "
            f"(at {rate:g} Hz) an attention window of {context} positions; it needs at least 1"
        )
    return TransformerSpec(
        input_dimension=required("input_dimension"),
        output_dimension=required("output_dimension"),
        d_model=d_model,
        num_heads=heads,
        num_layers=required("num_layers"),
        dim_feedforward=_positive_int(raw.get("dim_feedforward", 2048), f"{path}.dim_feedforward"),
        max_period=float(max_period),
        layer_scale=None if layer_scale is None else float(layer_scale),
        context=context,
        rate=rate,
    )


# -- quantizer -------------------------------------------------------------------


def _quantizer(d: dict[str, Any]) -> QuantizerSpec:
    raw = d.get("quantizer_kwargs", {})
    if not isinstance(raw, dict):
        raise ValueError(f"quantizer_kwargs: expected an object, got {raw!r}")
    # As in the release: the type inside quantizer_kwargs wins over the top-level one.
    if "quantizer_type" in raw:
        key, qtype = "quantizer_kwargs.quantizer_type", raw["quantizer_type"]
    else:
        key, qtype = "quantizer_type", d.get("quantizer_type", "rlfq")
    if qtype not in _QUANTIZER_TYPES:
        raise ValueError(
            f"{key} is {qtype!r}; supported: {', '.join(repr(t) for t in _QUANTIZER_TYPES)}"
        )

    def value(name: str, default: Any) -> int:
        return _positive_int(raw.get(name, default), f"quantizer_kwargs.{name}")

    input_dim = value("input_dim", 1024)
    rvq_dim = input_dim if raw.get("rvq_dim") is None else value("rvq_dim", None)
    output_dim = input_dim if raw.get("output_dim") is None else value("output_dim", None)
    return QuantizerSpec(
        kind=_QUANTIZER_TYPES[qtype],
        input_dim=input_dim,
        rvq_dim=rvq_dim,
        output_dim=output_dim,
        num_quantizers=value("num_quantizers", 32),
        codebook_size=value("codebook_size", 1024),
        codebook_dim=value("codebook_dim", 8),
    )
