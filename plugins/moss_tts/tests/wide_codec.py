"""A codec config for tests that count memory: the tiny one, its first decoder transformer
as wide as the release's (on the tests' path through ``conftest.py``)."""

from __future__ import annotations

from omni_moss_tts.codec import tiny_codec_config


def wide_codec_config() -> dict:
    """The tiny codec with its first decoder transformer at the release's width and heads."""
    raw = tiny_codec_config()
    first = next(s for s in raw["decoder_kwargs"] if s["module_type"] == "Transformer")
    first.update(d_model=1280, num_heads=20, dim_feedforward=5120)
    return raw
