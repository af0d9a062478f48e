"""The session's audio formats: ``audio/pcm`` at 24 kHz, and G.711 ``audio/pcmu`` / ``audio/pcma``.

The Realtime API moves audio as base64 in JSON events: 16-bit little-endian
mono PCM at 24 kHz, or 8 kHz G.711 (mu-law or A-law, one byte a sample) for
telephony. Inside the session everything is PCM16 at 24 kHz; these
functions convert at the edges. G.711 is a fixed, tiny algorithm (ITU-T
G.711), computed here with numpy rather than through the ``audioop`` module
Python deprecated; resampling between 8 and 24 kHz is linear interpolation,
enough for telephone-band speech.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SESSION_RATE = 24000  # what the session holds: the Realtime API's PCM rate
G711_RATE = 8000

# (GA type, beta name) of each format this server speaks.
FORMATS = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
BETA = {beta: ga for ga, beta in FORMATS.items()}


@dataclass(frozen=True)
class AudioFormat:
    type: str  # audio/pcm, audio/pcmu or audio/pcma
    rate: int

    def describe(self) -> dict[str, Any]:
        return (
            {"type": self.type, "rate": self.rate}
            if self.type == "audio/pcm"
            else {"type": self.type}
        )

    @property
    def bytes_per_second(self) -> int:
        return self.rate * (2 if self.type == "audio/pcm" else 1)


PCM24 = AudioFormat("audio/pcm", SESSION_RATE)


def parse_format(value: Any) -> AudioFormat:
    """A format as GA (``{"type": "audio/pcm", "rate": 24000}``) or beta (``"pcm16"``) writes it.

    ValueError with the accepted spellings for anything else.
    """
    kind, rate = value, None
    if isinstance(value, dict):
        kind, rate = value.get("type"), value.get("rate")
    kind = BETA.get(kind, kind) if isinstance(kind, str) else kind
    if kind not in FORMATS:
        raise ValueError(
            f"audio format {value!r} is not supported; use audio/pcm (24 kHz), audio/pcmu or "
            "audio/pcma (beta names: pcm16, g711_ulaw, g711_alaw)"
        )
    if kind == "audio/pcm":
        if rate not in (None, SESSION_RATE):
            raise ValueError(f"audio/pcm is 24000 Hz here, not {rate}")
        return PCM24
    return AudioFormat(kind, G711_RATE)


def to_session_pcm(data: bytes, fmt: AudioFormat) -> bytes:
    """Client audio in ``fmt`` as PCM16 at 24 kHz."""
    if fmt.type == "audio/pcm":
        return data[: len(data) - len(data) % 2]
    import numpy as np

    codes = np.frombuffer(data, dtype=np.uint8)
    samples = _ulaw_decode(codes) if fmt.type == "audio/pcmu" else _alaw_decode(codes)
    return resample(samples, G711_RATE, SESSION_RATE).astype("<i2").tobytes()


def from_session_pcm(pcm: bytes, fmt: AudioFormat) -> bytes:
    """PCM16 at 24 kHz as the client's output ``fmt``."""
    if fmt.type == "audio/pcm":
        return pcm
    import numpy as np

    samples = resample(np.frombuffer(pcm, dtype="<i2"), SESSION_RATE, G711_RATE)
    samples = samples.astype(np.int16)
    codes = _ulaw_encode(samples) if fmt.type == "audio/pcmu" else _alaw_encode(samples)
    return codes.tobytes()


def resample(samples: Any, rate_in: int, rate_out: int) -> Any:
    """Linear-interpolation resampling of int16 samples (float64 out, rounded by the caller)."""
    import numpy as np

    samples = np.asarray(samples, dtype=np.float64)
    if rate_in == rate_out or samples.size == 0:
        return samples.round()
    count = round(samples.size * rate_out / rate_in)
    where = np.arange(count) * (rate_in / rate_out)
    return np.interp(where, np.arange(samples.size), samples).round()


# -- ITU-T G.711 ---------------------------------------------------------------------

_BIAS = 0x84  # mu-law decoding's bias on 16-bit magnitudes
_ULAW_ENDS = [0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]  # segment upper bounds
_ALAW_ENDS = [0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF]


def _ulaw_encode(samples: Any) -> Any:
    """Sun's reference G.711 mu-law on 14-bit magnitudes (bias 33, clip 8159)."""
    import numpy as np

    v = samples.astype(np.int32) >> 2
    mask = np.where(v < 0, 0x7F, 0xFF)
    v = np.minimum(np.abs(v), 8159) + 33
    found = np.searchsorted(_ULAW_ENDS, v, side="left")
    segment = np.minimum(found, 7).astype(np.int32)
    code = np.where(found >= 8, 0x7F, (segment << 4) | ((v >> (segment + 1)) & 0x0F))
    return (code ^ mask).astype(np.uint8)


def _ulaw_decode(codes: Any) -> Any:
    import numpy as np

    u = (~codes.astype(np.int32)) & 0xFF
    sign, exponent, mantissa = u & 0x80, (u >> 4) & 0x07, u & 0x0F
    magnitude = (((mantissa << 3) + _BIAS) << exponent) - _BIAS
    return np.where(sign != 0, -magnitude, magnitude).astype(np.int16)


def _alaw_encode(samples: Any) -> Any:
    """Sun's reference G.711 A-law on 13-bit magnitudes."""
    import numpy as np

    v = samples.astype(np.int32) >> 3
    mask = np.where(v >= 0, 0xD5, 0x55)
    v = np.where(v >= 0, v, -v - 1)
    found = np.searchsorted(_ALAW_ENDS, v, side="left")
    segment = np.minimum(found, 7).astype(np.int32)
    mantissa = (v >> np.maximum(segment, 1)) & 0x0F
    code = np.where(found >= 8, 0x7F, (segment << 4) | mantissa)
    return (code ^ mask).astype(np.uint8)


def _alaw_decode(codes: Any) -> Any:
    import numpy as np

    a = codes.astype(np.int32) ^ 0x55
    sign, exponent, mantissa = a & 0x80, (a >> 4) & 0x07, a & 0x0F
    magnitude = np.where(
        exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0)
    )
    return np.where(sign != 0, magnitude, -magnitude).astype(np.int16)
