"""Decoding uploaded audio under bounds that hold whatever the file claims.

A compressed file is tiny next to its decoded samples: an hour of silent FLAC
is under 1 MB and decodes to hundreds of MB of float32. So a stage that takes
audio from a client must not decode first and measure afterwards. Here:

1. the encoded size is checked before base64 is decoded;
2. the container is recognised by its magic bytes (wav, flac, ogg, mp3 only),
   so libsndfile's parsers for exotic formats never see client bytes;
3. the header's sample rate, channel count and length are checked before a
   single sample is decoded;
4. decoding reads at most one frame past the limit, so a header that lies
   about (or does not state) the length still cannot make the read larger
   than the cap: reaching the extra frame means "too long".

numpy and soundfile are imported on first use: the core's import stays light.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from dataclasses import dataclass
from typing import Any

from .errors import MediaError

FORMATS = ("wav", "flac", "ogg", "mp3")
UNKNOWN_LENGTH = 2**62  # libsndfile reports SF_COUNT_MAX (2**63 - 1) when a header has no length


@dataclass(frozen=True)
class AudioLimits:
    """What one uploaded clip may be; every bound is checked before decoding."""

    max_seconds: float = 30.0
    min_seconds: float = 0.0
    max_bytes: int = 16 * 1024 * 1024  # the encoded file
    min_rate: int = 1_000
    max_rate: int = 192_000
    max_channels: int = 8
    max_samples: int = 4 * 1024 * 1024  # frames x channels after decoding: 16 MiB of float32

    def __post_init__(self) -> None:
        if not 0 <= self.min_seconds < self.max_seconds:
            raise ValueError(f"need 0 <= min_seconds < max_seconds, got {self}")
        if not 0 < self.min_rate <= self.max_rate or self.max_channels < 1:
            raise ValueError(f"sample-rate and channel bounds are inconsistent: {self}")
        if self.max_bytes < 1 or self.max_samples < 1:
            raise ValueError(f"max_bytes and max_samples must be >= 1: {self}")


@dataclass(frozen=True)
class DecodedAudio:
    """float32 samples shaped (frames, channels) and their sample rate."""

    samples: Any
    rate: int
    format: str

    @property
    def seconds(self) -> float:
        return self.samples.shape[0] / self.rate


def decode_base64_audio(encoded: Any, field: str, limits: AudioLimits) -> DecodedAudio:
    """``encoded`` (a base64 string of a wav/flac/ogg/mp3 file) decoded within ``limits``.

    Raises :class:`MediaError` naming ``field`` for anything refused.
    """
    if not isinstance(encoded, str):
        raise MediaError(field, f"{field!r} must be a base64 string of a {_names()} file")
    if len(encoded) // 4 * 3 > limits.max_bytes:
        raise MediaError(
            field,
            f"{field!r} is about {len(encoded) // 4 * 3} bytes; the limit is "
            f"{limits.max_bytes} bytes",
        )
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(
            field,
            f"{field!r} is not readable audio: it is not valid base64 "
            "(standard alphabet, padded, no line breaks)",
        ) from None
    return decode_audio(raw, field, limits)


def probe_audio(raw: bytes, field: str, limits: AudioLimits) -> float:
    """The seconds ``raw`` will decode to at most, from its header alone (nothing is decoded).

    Checks what :func:`decode_audio` checks before decoding, so a request can
    add up its clips and refuse itself before any of them is decoded. A
    header that states no length counts as the limit: the decode that
    follows cannot read more than that.
    """
    _check_container(raw, field, limits)
    import soundfile

    try:
        info = soundfile.info(io.BytesIO(raw))
    except Exception as exc:  # libsndfile's errors come as several types
        raise MediaError(field, f"{field!r} is not readable audio: {exc}") from None
    cap = _check_header(field, limits, info.samplerate, info.channels, info.frames)
    return min(info.frames, cap) / info.samplerate


def _check_container(raw: bytes, field: str, limits: AudioLimits) -> str:
    if len(raw) > limits.max_bytes:
        raise MediaError(
            field, f"{field!r} is {len(raw)} bytes; the limit is {limits.max_bytes} bytes"
        )
    kind = sniff(raw)
    if kind is None:
        raise MediaError(field, f"{field!r} is not readable audio: it is not a {_names()} file")
    return kind


def decode_audio(raw: bytes, field: str, limits: AudioLimits) -> DecodedAudio:
    """The encoded file ``raw`` decoded within ``limits`` (see the module docstring)."""
    kind = _check_container(raw, field, limits)
    import soundfile

    try:
        with soundfile.SoundFile(io.BytesIO(raw)) as sound:
            rate, channels, frames = sound.samplerate, sound.channels, sound.frames
            cap = _check_header(field, limits, rate, channels, frames)
            samples = sound.read(frames=cap + 1, dtype="float32", always_2d=True)
    except MediaError:
        raise
    except Exception as exc:  # libsndfile's errors come as several types
        raise MediaError(field, f"{field!r} is not readable audio: {exc}") from None
    if samples.shape[0] > cap:
        raise MediaError(
            field,
            f"{field!r} is longer than the limit of {_cap_text(limits, rate, channels)} "
            "(found while decoding: its header did not say so)",
        )
    decoded = DecodedAudio(samples, rate, kind)
    if decoded.seconds < limits.min_seconds:
        raise MediaError(
            field,
            f"{field!r} is {decoded.seconds:.2f} s long; give at least {limits.min_seconds:g} s",
        )
    return decoded


def sniff(raw: bytes) -> str | None:
    """The container of ``raw`` from its magic bytes, or None."""
    head = raw[:12]
    if head[:4] in (b"RIFF", b"RIFX", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3" or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def _check_header(field: str, limits: AudioLimits, rate: int, channels: int, frames: int) -> int:
    """The largest frame count we will read; refuses what the header already rules out."""
    if not limits.min_rate <= rate <= limits.max_rate:
        raise MediaError(
            field,
            f"{field!r} has a sample rate of {rate} Hz; accepted: "
            f"{limits.min_rate}-{limits.max_rate} Hz",
        )
    if not 1 <= channels <= limits.max_channels:
        raise MediaError(
            field, f"{field!r} has {channels} channels; accepted: 1-{limits.max_channels}"
        )
    cap = min(math.floor(limits.max_seconds * rate), limits.max_samples // channels)
    if frames < UNKNOWN_LENGTH and frames > cap:
        if frames / rate > limits.max_seconds:
            raise MediaError(
                field,
                f"{field!r} is {frames / rate:.1f} s long; the limit is {limits.max_seconds:g} s",
            )
        raise MediaError(
            field,
            f"{field!r} holds {frames * channels} samples; the limit is "
            f"{_cap_text(limits, rate, channels)}",
        )
    return cap


def _cap_text(limits: AudioLimits, rate: int, channels: int) -> str:
    cap = min(math.floor(limits.max_seconds * rate), limits.max_samples // channels)
    if cap >= math.floor(limits.max_seconds * rate):
        return f"{limits.max_seconds:g} s"
    return f"{cap * channels} samples ({cap / rate:.1f} s at {rate} Hz x {channels} channels)"


def _names() -> str:
    return ", ".join(FORMATS[:-1]) + f" or {FORMATS[-1]}"
