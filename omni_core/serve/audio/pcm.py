"""Audio out: float samples from the audio stage to PCM16, and the wire formats' names.

Stages emit 1-D float32 chunks in [-1, 1] (numpy arrays or torch tensors).
The wire formats are 16-bit mono: ``pcm`` is raw little-endian int16 (what
OpenAI's ``pcm`` and chat ``pcm16`` mean), ``wav`` is that PCM behind a
44-byte RIFF header written here (a streamed WAV cannot know its length, so
its size fields hold 0xFFFFFFFF, as streaming servers commonly do); flac,
mp3, opus and aac are encoded by :mod:`.encoders` (PyAV, imported only when
asked for). numpy is imported lazily, so that the core stays importable
without it.
"""

from __future__ import annotations

import struct
from typing import Any

MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "pcm16": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # Opus in an Ogg container
    "aac": "audio/aac",  # ADTS frames
}
UNKNOWN_LENGTH = 0xFFFFFFFF


def to_pcm16(chunk: Any) -> bytes:
    """One chunk of float samples as little-endian int16 bytes (clipped; NaN becomes 0)."""
    if hasattr(chunk, "detach"):  # a torch tensor, without importing torch
        chunk = chunk.detach().to("cpu").float().numpy()
    if isinstance(chunk, (bytes, bytearray, memoryview, str)):
        raise TypeError(
            "an audio chunk must be float samples (numpy array or tensor), "
            f"not {type(chunk).__name__}"
        )
    import numpy as np

    samples = np.asarray(chunk, dtype=np.float32).reshape(-1)
    samples = np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0)
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None, channels: int = 1) -> bytes:
    """A canonical 44-byte PCM16 WAV header; ``data_bytes=None`` for a stream of unknown length."""
    block = 2 * channels
    data = UNKNOWN_LENGTH if data_bytes is None else data_bytes
    riff = UNKNOWN_LENGTH if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
        + b"data"
        + struct.pack("<I", data)
    )
