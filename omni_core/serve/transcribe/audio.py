"""The uploaded ``file`` made into audio the pipeline reads, under the core's bounds.

Two ways in, both bounded before a sample is kept:

- wav, flac, ogg and mp3 (recognised by their magic bytes) are decoded by
  :func:`omni_core.media.decode_audio`, the same bounded decoder the
  pipeline's own stage uses on a chat ``input_audio`` part (header checked
  before decoding, at most one frame past the cap read). The file then
  travels unchanged, as that ``input_audio`` part;
- anything else PyAV (FFmpeg) reads (m4a, webm, opus in Matroska, aac …) is
  decoded here, its first audio stream resampled to 16 kHz mono PCM16, and
  the decoding stops one sample past the duration cap, so a file that lies
  about its length cannot make us hold more. It travels as a WAV.

Checking here, not only in the stage, gives a client the 400 it expects
(``param: "file"``) before anything is admitted, and the clip's duration for
``verbose_json``. The stage decodes again under its own factory limits
(``factory.max_audio_seconds``, ``factory.max_media_bytes``), which may be
tighter than :data:`MAX_SECONDS`.

numpy, soundfile and PyAV are imported on first use, and all of this runs in
a worker thread (see :func:`prepare_audio`'s callers).
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass

from ...media import AudioLimits, MediaError, decode_audio
from ...media.audio_input import sniff
from ..audio.pcm import wav_header

FIELD = "file"
MAX_SECONDS = 600.0  # the qwen3-omni preprocessing stage's per-request audio cap
TRANSCODE_RATE = 16_000  # what the audio encoders of listening models read


@dataclass(frozen=True)
class Clip:
    """The audio as the pipeline will receive it: base64 of a ``format`` file, and its length."""

    data: str
    format: str  # wav, flac, ogg or mp3
    seconds: float


def limits_for(max_bytes: int) -> AudioLimits:
    """The bounds of one upload: the body limit for its size, :data:`MAX_SECONDS` for its length."""
    return AudioLimits(max_seconds=MAX_SECONDS, max_bytes=max_bytes)


def prepare_audio(raw: bytes, limits: AudioLimits) -> Clip:
    """``raw`` checked and, where needed, transcoded; MediaError naming ``file`` if refused."""
    if not raw:
        raise MediaError(FIELD, "'file' is empty; upload an audio file")
    kind = sniff(raw)
    if kind is not None:
        decoded = decode_audio(raw, FIELD, limits)
        return Clip(base64.b64encode(raw).decode(), kind, decoded.seconds)
    pcm = _transcode(raw, limits)
    wav = wav_header(TRANSCODE_RATE, len(pcm)) + pcm
    return Clip(base64.b64encode(wav).decode(), "wav", len(pcm) / 2 / TRANSCODE_RATE)


def _transcode(raw: bytes, limits: AudioLimits) -> bytes:
    """The first audio stream of ``raw`` as 16 kHz mono PCM16, at most ``limits.max_seconds``."""
    if len(raw) > limits.max_bytes:
        raise MediaError(
            FIELD, f"'file' is {len(raw)} bytes; the limit is {limits.max_bytes} bytes"
        )
    try:
        import av
    except ImportError:
        raise MediaError(
            FIELD,
            "'file' is not wav, flac, ogg or mp3, and this server cannot read other formats "
            "(the operator can install PyAV: pip install av)",
        ) from None
    cap = math.floor(limits.max_seconds * TRANSCODE_RATE)
    out = bytearray()
    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            if not container.streams.audio:
                raise MediaError(FIELD, "'file' holds no audio stream")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=TRANSCODE_RATE)
            for frame in container.decode(audio=0):
                for piece in resampler.resample(frame):
                    out += bytes(piece.planes[0])[: piece.samples * 2]
                if len(out) > 2 * cap:
                    raise MediaError(
                        FIELD, f"'file' is longer than the limit of {limits.max_seconds:g} s"
                    )
            for piece in resampler.resample(None):
                out += bytes(piece.planes[0])[: piece.samples * 2]
    except MediaError:
        raise
    except Exception as exc:  # FFmpeg's errors come as many types (av.error.*, ValueError …)
        raise MediaError(
            FIELD, f"'file' is not readable audio: {exc}; send a wav, flac, mp3, ogg, m4a or webm"
        ) from None
    if len(out) > 2 * cap:
        raise MediaError(FIELD, f"'file' is longer than the limit of {limits.max_seconds:g} s")
    if not out:
        raise MediaError(FIELD, "'file' holds no audio samples")
    return bytes(out)
