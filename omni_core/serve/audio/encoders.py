"""Audio out in every speech format, streamed: PCM16 in as the audio stage emits it, bytes out.

One :class:`StreamEncoder` per response: ``feed(chunk) -> bytes`` as chunks
arrive, ``flush() -> bytes`` at the end. Between the pipeline and the bytes
sit the changes the client asked for, each a class of its own: a
:class:`Tempo` (``speed``: FFmpeg's ``atempo``, duration changed, pitch kept)
and a :class:`Resampler` (``sample_rate``, or a codec's own rate: swresample).

How each format is written, and why:

- ``pcm`` and ``wav`` are written here (no PyAV needed unless speed or rate
  change): raw little-endian int16, and that behind the canonical 44-byte
  RIFF header of :func:`.audio.wav_header`. A streamed WAV cannot know its
  length, so its size fields hold 0xFFFFFFFF. Kept by hand on purpose:
  FFmpeg's wav muxer writes the same sizes plus a LIST chunk, and would make
  the commonest format depend on PyAV.
- ``mp3`` (libmp3lame, mp3 muxer), ``opus`` (libopus in Ogg, always at
  48 kHz, Opus's native rate and what every Opus decoder outputs), ``aac``
  (FFmpeg's encoder, ADTS frames) and ``flac`` go through PyAV, imported on
  first use: the core stays importable without it, and a server without it
  answers 400 naming the format and ``pip install av``.

Streamed, the muxer writes to a sink that cannot seek, so every packet leaves
as soon as it is encoded (Ogg pages are cut every 20 ms for the same reason).
Not streamed, everything comes out of :meth:`StreamEncoder.flush`, and the
muxer, writing to a seekable buffer, goes back to fill in what a stream
cannot know: WAV sizes, FLAC's total samples and MD5, MP3's Xing/LAME frame
(frame count and encoder padding, so that decoders trim exactly). Lossy
codecs add priming and padding (AAC in ADTS cannot say so: up to two 1024-
sample frames more than was sent). An encoder is single-use and not
thread-safe.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..common.errors import APIError
from .pcm import MEDIA_TYPES, to_pcm16, wav_header

SPEED_RANGE = (0.25, 4.0)  # what OpenAI accepts
ATEMPO_RANGE = (0.5, 2.0)  # one atempo instance; past 2 it drops samples instead of blending
TEMPO_FRAMES_PER_SECOND = 50  # 20 ms frames into atempo (see StreamEncoder._frames)
OGG_PAGE_MICROSECONDS = 20_000  # streamed: one 20 ms Opus packet per page, out at once
INSTALL_AV = "pip install av"


@dataclass(frozen=True)
class Format:
    """A ``response_format``: its codec and muxer (None: written here) and what it can take."""

    name: str
    codec: str | None = None
    container: str | None = None
    rates: tuple[int, ...] | None = None  # the only sample rates the codec takes; None: any
    native_rate: int | None = None  # always encoded at this rate
    bit_rate: int | None = None  # mono speech; lossy codecs only

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.name]

    @property
    def needs_av(self) -> bool:
        return self.codec is not None


_MPEG_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
FORMATS = {
    fmt.name: fmt
    for fmt in (
        Format("wav"),
        Format("pcm"),
        Format("flac", "flac", "flac"),
        Format("mp3", "libmp3lame", "mp3", _MPEG_RATES, bit_rate=64_000),
        Format("opus", "libopus", "ogg", (48000,), 48000, bit_rate=64_000),
        Format("aac", "aac", "adts", _MPEG_RATES, bit_rate=64_000),
    )
}
FORMATS["pcm16"] = Format("pcm16")  # the chat API's name of pcm


def get_format(name: str, param: str = "response_format") -> Format:
    """The format called ``name``; APIError(400) naming ``param`` if there is none."""
    fmt = FORMATS.get(name)
    if fmt is None:
        known = ", ".join(sorted(FORMATS))
        raise APIError(400, f"unknown audio format {name!r}; supported: {known}", param=param)
    return fmt


def check_format(name: str, param: str = "response_format") -> Format:
    """The format called ``name`` if this server can encode it; APIError(400) naming ``param``."""
    fmt = get_format(name, param)
    if fmt.needs_av:
        require_av(f"encode {fmt.name}", param, fmt.codec)
    return fmt


def output_rate(fmt: Format, pipeline_rate: int, requested: int | None) -> int:
    """The sample rate the client gets: what it asked for, else the pipeline's.

    A codec with fixed rates (MP3, AAC) refuses a requested rate it cannot
    take; unasked, it gets the nearest rate at or above the pipeline's. Opus
    is always 48 kHz.
    """
    if fmt.native_rate is not None:
        if requested not in (None, fmt.native_rate):
            raise APIError(
                400,
                f"{fmt.name} is always encoded at {fmt.native_rate} Hz (what every {fmt.name} "
                f"decoder outputs); omit sample_rate or send {fmt.native_rate}, "
                "or ask for another response_format",
                param="sample_rate",
            )
        return fmt.native_rate
    if fmt.rates is None:
        return requested or pipeline_rate
    if requested is not None:
        if requested not in fmt.rates:
            raise APIError(
                400,
                f"{fmt.name} cannot be encoded at {requested} Hz; "
                f"send one of {', '.join(map(str, fmt.rates))}",
                param="sample_rate",
            )
        return requested
    return min((r for r in fmt.rates if r >= pipeline_rate), default=max(fmt.rates))


def require_av(what: str, param: str, codec: str | None = None) -> None:
    """APIError(400) naming ``param`` unless PyAV (with ``codec``) can be used here."""
    try:
        import av
    except (ImportError, OSError):
        raise APIError(
            400,
            f"this server cannot {what}: the av package (PyAV) is not installed "
            f"({INSTALL_AV}); ask for wav or pcm at speed 1 and the default sample rate",
            param=param,
        ) from None
    if codec is not None and codec not in av.codecs_available:
        raise APIError(
            400,
            f"this server cannot {what}: its FFmpeg (in PyAV) has no {codec} encoder "
            "(install a PyAV build that has it); ask for another format",
            param=param,
        )


class Tempo:
    """``speed`` without a pitch change: FFmpeg's ``atempo``, chained past one instance's range.

    atempo is a WSOLA time-stretch: it overlaps and adds windows of the
    signal, so tones keep their frequency and only the duration changes. It
    holds about one window (tens of ms) back, which :meth:`push` ``(None)``
    drains at the end.
    """

    def __init__(self, speed: float, rate: int):
        import av

        graph = av.filter.Graph()
        nodes = [
            graph.add_abuffer(
                sample_rate=rate, format="s16", layout="mono", time_base=Fraction(1, rate)
            )
        ]
        nodes += [graph.add("atempo", f"{factor:.9g}") for factor in atempo_factors(speed)]
        nodes.append(graph.add("abuffersink"))
        graph.link_nodes(*nodes).configure()
        self._graph = graph

    def push(self, frame: Any) -> list[Any]:
        """The frames that ``frame`` (None: the end) lets out."""
        import av

        self._graph.push(frame)
        frames = []
        while True:
            try:
                frames.append(self._graph.pull())
            except (av.BlockingIOError, av.EOFError):
                return frames


def atempo_factors(speed: float) -> list[float]:
    """Factors within one atempo's range whose product is ``speed``: 4.0 -> [2.0, 2.0]."""
    low, high = ATEMPO_RANGE
    count = max(1, math.ceil(abs(math.log(speed)) / math.log(high) - 1e-9))
    factor = speed ** (1 / count)
    assert low <= factor <= high, (speed, count)
    return [factor] * count


class Resampler:
    """To ``rate`` with swresample (band-limited, not sample dropping), as int16 mono."""

    def __init__(self, rate: int):
        import av

        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)

    def push(self, frame: Any) -> list[Any]:
        """The frames that ``frame`` (None: the end) lets out."""
        return list(self._resampler.resample(frame))


class RawWriter:
    """``pcm`` (bare int16) or ``wav`` (int16 behind a 44-byte header), written here."""

    def __init__(self, fmt: Format, rate: int, streaming: bool):
        self._wav = fmt.name == "wav"
        self._rate, self._streaming = rate, streaming
        self._started = False
        self._held = bytearray()  # not streaming: the whole signal, for exact sizes

    def write(self, pcm: bytes) -> bytes:
        if not self._streaming:
            self._held += pcm
            return b""
        if self._wav and not self._started:
            self._started = True
            return wav_header(self._rate, None) + pcm
        return pcm

    def close(self) -> bytes:
        if self._streaming:
            return b"" if self._started or not self._wav else wav_header(self._rate, None)
        body = bytes(self._held)
        return wav_header(self._rate, len(body)) + body if self._wav else body


class _Sink:
    """A write-only file for the muxer: no seek, so FFmpeg writes packets out as they come."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self.parts)
        self.parts.clear()
        return data


class ContainerWriter:
    """A codec in a container through PyAV: mp3, opus (Ogg), aac (ADTS), flac."""

    def __init__(self, fmt: Format, rate: int, streaming: bool):
        import av

        self._streaming = streaming
        self._sink: Any = _Sink() if streaming else io.BytesIO()
        options = {}
        if streaming and fmt.container == "ogg":
            options["page_duration"] = str(OGG_PAGE_MICROSECONDS)
        self._container = av.open(self._sink, "w", format=fmt.container, container_options=options)
        self._stream = self._container.add_stream(fmt.codec, rate=rate, layout="mono")
        if fmt.bit_rate:
            self._stream.bit_rate = fmt.bit_rate
        self._closed = False

    def write_frames(self, frames: Iterable[Any]) -> bytes:
        for frame in frames:
            self._container.mux(self._stream.encode(frame))
        return self._sink.take() if self._streaming else b""

    def close(self) -> bytes:
        """Drain the codec, write the trailer: the last bytes (not streaming: all of them)."""
        if self._closed:
            return b""
        self._closed = True
        self._container.mux(self._stream.encode(None))
        self._container.close()
        return self._sink.take() if self._streaming else self._sink.getvalue()

    def abandon(self) -> None:
        if not self._closed:
            self._closed = True
            self._container.close()


class StreamEncoder:
    """PCM16 (or float) chunks at ``in_rate`` in, ``fmt`` bytes at ``out_rate`` and ``speed`` out.

    ``streaming``: bytes leave :meth:`feed` as soon as the codec has them;
    otherwise all of them leave :meth:`flush`, with exact sizes in the
    headers. Raises APIError(400), naming ``param`` (or ``speed``,
    ``sample_rate``), when the server cannot make what is asked for.
    """

    def __init__(
        self,
        fmt: str,
        in_rate: int,
        out_rate: int | None = None,
        speed: float = 1.0,
        *,
        streaming: bool = True,
        param: str = "response_format",
    ):
        self.format = check_format(fmt, param)
        self.in_rate = in_rate
        self.out_rate = output_rate(self.format, in_rate, out_rate)
        self.speed = speed
        if speed != 1.0:
            if not SPEED_RANGE[0] <= speed <= SPEED_RANGE[1]:
                raise APIError(
                    400,
                    f"speed must be within {SPEED_RANGE[0]:g} and {SPEED_RANGE[1]:g}, "
                    f"got {speed:g}",
                    param="speed",
                )
            require_av("change speed", "speed")
        if self.out_rate != in_rate:
            require_av(f"resample {in_rate} Hz to {self.out_rate} Hz", "sample_rate")
        self._tempo = Tempo(speed, in_rate) if speed != 1.0 else None
        self._resampler = Resampler(self.out_rate) if self.out_rate != in_rate else None
        self._writer: RawWriter | ContainerWriter = (
            ContainerWriter(self.format, self.out_rate, streaming)
            if self.format.needs_av
            else RawWriter(self.format, self.out_rate, streaming)
        )
        self._fed = 0  # samples in, for the input frames' timestamps
        self.samples_out = 0  # samples at out_rate handed to the writer

    @property
    def media_type(self) -> str:
        return self.format.media_type

    def feed(self, chunk: Any) -> bytes:
        """Encode one chunk (PCM16 little-endian bytes, or float samples in [-1, 1])."""
        pcm = _pcm16(chunk)
        if not pcm:
            return b""
        if self._tempo is None and self._resampler is None and isinstance(self._writer, RawWriter):
            self.samples_out += len(pcm) // 2
            return self._writer.write(pcm)
        return self._write([out for frame in self._frames(pcm) for out in self._changed(frame)])

    def flush(self) -> bytes:
        """The end: drain the tempo, the resampler and the codec; the last bytes."""
        tail = self._write(self._changed(None)) if self._tempo or self._resampler else b""
        return tail + self._writer.close()

    def close(self) -> None:
        """Give the codec's resources back without finishing (a response that failed)."""
        if isinstance(self._writer, ContainerWriter):
            self._writer.abandon()

    def _frames(self, pcm: bytes) -> list[Any]:
        """``pcm`` as int16 mono frames: one, or 20 ms ones when a tempo follows.

        atempo lets a frame's output out only once the next frame has come,
        so one frame per chunk would hold a whole chunk back.
        """
        import av
        import numpy as np

        samples = np.frombuffer(pcm, dtype="<i2").reshape(1, -1)
        step = max(1, self.in_rate // TEMPO_FRAMES_PER_SECOND) if self._tempo else samples.size
        frames = []
        for start in range(0, samples.shape[1], step):
            frame = av.AudioFrame.from_ndarray(
                samples[:, start : start + step], format="s16", layout="mono"
            )
            frame.sample_rate, frame.pts = self.in_rate, self._fed
            frame.time_base = Fraction(1, self.in_rate)
            self._fed += frame.samples
            frames.append(frame)
        return frames

    def _changed(self, frame: Any) -> list[Any]:
        """``frame`` (None: the end, draining each stage) through the tempo, then the resampler."""
        ending = frame is None
        frames = [] if ending else [frame]
        for stage in (self._tempo, self._resampler):
            if stage is not None:
                frames = [out for each in frames for out in stage.push(each)]
                if ending:
                    frames += stage.push(None)
        return frames

    def _write(self, frames: list[Any]) -> bytes:
        for frame in frames:
            frame.pts = self.samples_out
            frame.time_base = Fraction(1, self.out_rate)
            self.samples_out += frame.samples
        if isinstance(self._writer, ContainerWriter):
            return self._writer.write_frames(frames)
        return self._writer.write(b"".join(f.to_ndarray().astype("<i2").tobytes() for f in frames))


def _pcm16(chunk: Any) -> bytes:
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        data = bytes(chunk)
        if len(data) % 2:
            raise ValueError(f"PCM16 audio has an even number of bytes, got {len(data)}")
        return data
    return to_pcm16(chunk)


def encode_whole(
    pcm: bytes, fmt: str, in_rate: int, out_rate: int | None = None, speed: float = 1.0
) -> bytes:
    """A whole signal (PCM16 bytes) as one body in ``fmt``, with exact sizes in its headers."""
    encoder = StreamEncoder(fmt, in_rate, out_rate, speed, streaming=False)
    try:
        return encoder.feed(pcm) + encoder.flush()
    except BaseException:
        encoder.close()
        raise
