"""A Qwen codec's weights counted from its config, against the modules' own count.

The planner sizes the vocoder from these formulas (``codec_params.py``), so a
module that gains or loses a weight without the formula following fails here.
Counted on the ``meta`` device: no memory, a fraction of a second at the
release's size.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from omni_qwen3_tts.codec_params import speech_decoder_params, speech_encoder_params  # noqa: E402
from omni_qwen3_tts.config import DecoderConfig, EncoderConfig  # noqa: E402
from omni_qwen3_tts.source import SOURCE  # noqa: E402
from omni_qwen3_tts.speech_tokenizer.decoder import Decoder  # noqa: E402
from omni_qwen3_tts.speech_tokenizer.encoder import Encoder  # noqa: E402

TINY = json.loads((SOURCE.presets_dir / "tiny" / "speech_tokenizer" / "config.json").read_text())
#: the release's decoder transformer (512 wide, 16 heads of 64, MLP 1024), as its
#: speech_tokenizer/config.json holds it
RELEASE_DECODER = DecoderConfig(hidden_size=512, head_dim=64, intermediate_size=1024)


def held(module: torch.nn.Module) -> int:
    """What loading fills: parameters and persistent buffers (the encoder's codebooks)."""
    return sum(t.numel() for t in module.state_dict().values())


@pytest.mark.parametrize(
    "cfg",
    [
        DecoderConfig(),
        RELEASE_DECODER,
        DecoderConfig.from_dict(TINY["decoder_config"]),
        dataclasses.replace(
            RELEASE_DECODER,
            attention_bias=True,
            num_key_value_heads=4,
            upsample_rates=(4, 4, 4, 2),
            upsampling_ratios=(2,),
            decoder_dim=768,
        ),
    ],
    ids=["defaults", "release", "tiny", "biased-gqa-rates"],
)
def test_the_decoder_count_is_the_modules(cfg: DecoderConfig) -> None:
    with torch.device("meta"):
        decoder = Decoder(cfg)
    assert speech_decoder_params(cfg) == held(decoder)


@pytest.mark.parametrize(
    "cfg",
    [
        EncoderConfig(),
        EncoderConfig.from_dict(TINY["encoder_config"]),
        dataclasses.replace(
            EncoderConfig(),
            use_conv_shortcut=True,
            num_residual_layers=2,
            attention_bias=True,
            vector_quantization_hidden_dimension=512,
            num_quantizers=16,
        ),
    ],
    ids=["defaults", "tiny", "shortcut-bias-unprojected"],
)
def test_the_encoder_count_is_the_modules(cfg: EncoderConfig) -> None:
    with torch.device("meta"):
        encoder = Encoder(cfg)
    assert speech_encoder_params(cfg) == held(encoder)
