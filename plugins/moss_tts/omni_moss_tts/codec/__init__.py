"""Our implementation of the MOSS audio tokenizer ("Cat" codec) used by MOSS-TTS.

``CodecConfig`` parses the release's ``config.json``; ``AudioTokenizer`` is
the codec (state-dict names equal to the release's, so its checkpoint loads
by name); ``prepare_reference`` readies a clip for ``encode``; streams of
decoding (``CodecStream``) can be batched across requests.
"""

from .audio import loudness_normalize, prepare_reference
from .config import CodecConfig, PatchSpec, QuantizerSpec, TransformerSpec
from .dummy import dummy_fill_codec
from .model import AudioTokenizer
from .streaming import CodecStream
from .tiny import tiny_codec_config

__all__ = [
    "AudioTokenizer",
    "CodecConfig",
    "CodecStream",
    "PatchSpec",
    "QuantizerSpec",
    "TransformerSpec",
    "dummy_fill_codec",
    "loudness_normalize",
    "prepare_reference",
    "tiny_codec_config",
]
