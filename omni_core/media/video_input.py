"""Reading uploaded video under bounds that hold whatever the file claims.

A video is the most compressible thing a client can send: a few kilobytes of
H.264 can declare an 8K frame (a black one compresses to nothing) or ten
hours of frames, and decoding it first and measuring afterwards would cost
the server gigabytes. So, with PyAV (FFmpeg's libraries, no ``ffmpeg``
binary):

1. the encoded size is checked, and the container is recognised by its magic
   bytes (MP4/MOV, Matroska/WebM, AVI); FFmpeg is then told to use that one
   demuxer, so its parsers for the hundreds of other formats never see
   client bytes;
2. the header is read with the decoders told to skip every frame
   (``skip_frame=all``: FFmpeg's stream probe would otherwise decode a frame
   to learn what the header already says, 80 MB for one 8K frame) and with
   FFmpeg's own ``max_pixels`` decoder guard set to our limit;
3. codec, width, height, pixels per frame, duration and frame count are
   checked against :class:`VideoLimits` (a 400 naming the field and the
   limit) before a single frame is decoded;
4. decoding (:func:`decode_video_frames`) streams frame by frame, converts
   only the frames asked for, and stops after the last of them; a stream that
   ends early (a header that overstated its frames) repeats its last frame
   for the indices it lacks, so a sampled layout never changes size.

The sound track (:func:`decode_video_audio`) is decoded the way the Qwen-Omni
reference utilities read it (``ffmpeg -f s16le`` through ``audioread``):
native rate and channels, 16-bit samples, scaled to float by 1/32768, bounded
like any uploaded clip (:class:`~omni_core.media.AudioLimits`).

PyAV and numpy are imported on first use: the core's import stays light.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import OmniError
from .audio_input import AudioLimits, DecodedAudio
from .errors import MediaError

CONTAINERS = ("mp4", "matroska", "avi")
DEMUXERS = {"mp4": "mov", "matroska": "matroska", "avi": "avi"}
VIDEO_CODECS = ("h264", "hevc", "vp8", "vp9", "av1", "mpeg4", "mjpeg")
AUDIO_CODECS = ("aac", "mp3", "opus", "vorbis", "flac", "alac", "pcm_s16le", "pcm_f32le")


@dataclass(frozen=True)
class VideoLimits:
    """What one uploaded video may be; every bound is checked before decoding."""

    max_bytes: int = 64 * 1024 * 1024  # the encoded file
    max_seconds: float = 600.0  # the container's (or the video stream's) duration
    max_frames: int = 36_000  # frames the video stream declares (or duration x rate)
    max_side: int = 4096
    max_pixels: int = 4096 * 2160  # one frame, as declared: 4K; an 8K frame is refused
    max_rate: float = 240.0  # frames per second the stream declares

    def __post_init__(self) -> None:
        if min(self.max_bytes, self.max_frames, self.max_side, self.max_pixels) < 1:
            raise ValueError(f"video byte, frame and pixel bounds must be >= 1: {self}")
        if not self.max_seconds > 0 or not self.max_rate > 0:
            raise ValueError(f"max_seconds and max_rate must be > 0: {self}")


@dataclass(frozen=True)
class VideoInfo:
    """What a video's header says, after the limits accepted it."""

    container: str
    codec: str
    width: int
    height: int
    frames: int  # declared, or estimated from duration x rate when the header has no count
    fps: float  # the stream's average frame rate
    seconds: float
    audio: AudioTrack | None


@dataclass(frozen=True)
class AudioTrack:
    """The first audio stream's header: codec, rate, channels and declared seconds."""

    codec: str
    rate: int
    channels: int
    seconds: float


def sniff_video(raw: bytes) -> str | None:
    """The container of ``raw`` from its magic bytes, or None."""
    head = bytes(raw[:16])
    if head[4:8] == b"ftyp":
        return "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    return None


def probe_video(raw: bytes, field: str, limits: VideoLimits) -> VideoInfo:
    """The header of the video file ``raw``, checked against ``limits``; no frame is decoded."""
    container = _check_container(raw, field, limits)
    with _open(raw, field, container, limits, skip_frames=True) as opened:
        return _read_header(opened, field, container, limits)


def decode_video_frames(
    raw: bytes,
    field: str,
    limits: VideoLimits,
    indices: Iterable[int],
    convert: Callable[[Any], Any] | None = None,
) -> list[Any]:
    """The frames at ``indices`` (0-based, presentation order) as uint8 RGB ``[H, W, 3]`` arrays.

    The header is checked again (the bytes may not be the ones probed).
    Frames are decoded one at a time and only the wanted ones are converted
    (and passed through ``convert``, e.g. a resize, so that only the small
    result is kept); decoding stops after the largest index. An index past
    the end of the stream gets the last decoded frame. Raises
    :class:`MediaError` naming ``field`` for anything refused or undecodable.
    """
    indices = [int(i) for i in indices]
    wanted = sorted(set(indices))
    if not wanted or wanted[0] < 0:
        raise ValueError(f"indices must be non-negative and non-empty, got {wanted[:4]}")
    container = _check_container(raw, field, limits)
    kept: dict[int, Any] = {}
    last: Any = None
    with _open(raw, field, container, limits, skip_frames=False) as opened:
        _read_header(opened, field, container, limits)
        stream = opened.streams.video[0]
        stream.thread_type = "AUTO"
        targets, position = set(wanted), 0
        try:
            for frame in opened.decode(stream):
                if frame.width * frame.height > limits.max_pixels:
                    raise MediaError(
                        field,
                        f"{field!r} holds a {frame.width} x {frame.height} frame; the limit is "
                        f"{limits.max_pixels} pixels (found while decoding: its header did not "
                        "say so)",
                    )
                if position in targets or position == wanted[-1]:
                    pixels = frame.to_ndarray(format="rgb24")
                    last = convert(pixels) if convert is not None else pixels
                    kept[position] = last
                position += 1
                if position > wanted[-1]:
                    break
        except MediaError:
            raise
        except MemoryError:
            raise
        except Exception as exc:  # FFmpeg reports damaged streams as several error types
            raise MediaError(field, f"{field!r} is not a decodable video: {exc}") from None
    if last is None:
        raise MediaError(field, f"{field!r} is not a decodable video: it holds no video frame")
    return [kept.get(i, last) for i in indices]


def decode_video_audio(
    raw: bytes, field: str, limits: AudioLimits, video: VideoLimits
) -> DecodedAudio | None:
    """The first audio stream of ``raw`` as float32 ``(frames, channels)``; None without one.

    Samples go through 16-bit integers, as the reference's ``ffmpeg -f s16le``
    read does; the track's declared length, rate and channel count are checked
    against ``limits`` first, and decoding stops one sample past the cap.
    """
    import numpy as np

    kind = _check_container(raw, field, video)
    with _open(raw, field, kind, video, skip_frames=False) as opened:
        if not opened.streams.audio:
            return None
        stream = opened.streams.audio[0]
        track = _audio_track(stream, opened, field)
        if not limits.min_rate <= track.rate <= limits.max_rate:
            raise MediaError(
                field,
                f"{field!r}: its sound track has a sample rate of {track.rate} Hz; accepted: "
                f"{limits.min_rate}-{limits.max_rate} Hz",
            )
        if not 1 <= track.channels <= limits.max_channels:
            raise MediaError(
                field,
                f"{field!r}: its sound track has {track.channels} channels; accepted: "
                f"1-{limits.max_channels}",
            )
        if track.seconds > limits.max_seconds:
            raise MediaError(
                field,
                f"{field!r}: its sound track is {track.seconds:.1f} s long; the limit is "
                f"{limits.max_seconds:g} s",
            )
        cap = min(math.floor(limits.max_seconds * track.rate), limits.max_samples // track.channels)
        import av

        resampler = av.AudioResampler(format="s16", layout=stream.layout, rate=track.rate)
        chunks, total = [], 0
        try:
            for frame in opened.decode(stream):
                for out in resampler.resample(frame):
                    block = out.to_ndarray().reshape(-1, track.channels)
                    chunks.append(block)
                    total += block.shape[0]
                if total > cap:
                    break
            else:
                for out in resampler.resample(None):
                    block = out.to_ndarray().reshape(-1, track.channels)
                    chunks.append(block)
                    total += block.shape[0]
        except MemoryError:
            raise
        except Exception as exc:
            raise MediaError(field, f"{field!r}: its sound track is not decodable: {exc}") from None
    if total > cap:
        raise MediaError(
            field,
            f"{field!r}: its sound track is longer than the limit of {limits.max_seconds:g} s "
            "(found while decoding: its header did not say so)",
        )
    if not chunks:
        return None
    samples = np.concatenate(chunks).astype(np.float32) / np.float32(32768.0)
    return DecodedAudio(samples, track.rate, kind)


class _Opened:
    """``av.open`` as a context manager that always closes, refusing what cannot open."""

    def __init__(self, container: Any):
        self.container = container

    def __enter__(self) -> Any:
        return self.container

    def __exit__(self, *exc: object) -> None:
        self.container.close()


def _open(raw: bytes, field: str, kind: str, limits: VideoLimits, *, skip_frames: bool) -> Any:
    av = _pyav()
    options = {"max_pixels": str(limits.max_pixels)}
    if skip_frames:
        options["skip_frame"] = "all"
    try:
        container = av.open(io.BytesIO(raw), "r", format=DEMUXERS[kind], options=options)
    except MemoryError:
        raise
    except Exception:
        raise MediaError(
            field,
            f"{field!r} is not a readable {kind.upper()} video: its header is damaged or cut short",
        ) from None
    return _Opened(container)


def _check_container(raw: bytes, field: str, limits: VideoLimits) -> str:
    if len(raw) > limits.max_bytes:
        raise MediaError(
            field, f"{field!r} is {len(raw)} bytes; the limit is {limits.max_bytes} bytes"
        )
    kind = sniff_video(raw)
    if kind is None:
        raise MediaError(field, f"{field!r} is not a readable video: it is not a {_names()} file")
    return kind


def _read_header(opened: Any, field: str, kind: str, limits: VideoLimits) -> VideoInfo:
    if not opened.streams.video:
        raise MediaError(field, f"{field!r} holds no video stream")
    stream = opened.streams.video[0]
    codec = stream.codec_context.name
    if codec not in VIDEO_CODECS:
        raise MediaError(
            field,
            f"{field!r} is {codec!r} video; accepted codecs: {', '.join(VIDEO_CODECS)}",
        )
    width, height = int(stream.codec_context.width), int(stream.codec_context.height)
    if width < 1 or height < 1:
        raise MediaError(field, f"{field!r} declares an empty frame ({width} x {height} pixels)")
    if width * height > limits.max_pixels:
        raise MediaError(
            field,
            f"{field!r} has {width} x {height} = {width * height} pixels per frame; the limit "
            f"is {limits.max_pixels} pixels",
        )
    if max(width, height) > limits.max_side:
        raise MediaError(
            field, f"{field!r} is {width} x {height} pixels; no side may exceed {limits.max_side}"
        )
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    fps = float(rate) if rate else 0.0
    if not 0 < fps <= limits.max_rate:
        raise MediaError(
            field,
            f"{field!r} declares {fps:g} frames per second; accepted: up to {limits.max_rate:g}",
        )
    seconds = _seconds(stream, opened)
    if seconds is None:
        raise MediaError(field, f"{field!r} does not say how long it is; send an MP4 or WebM file")
    if seconds > limits.max_seconds:
        raise MediaError(
            field, f"{field!r} is {seconds:.1f} s long; the limit is {limits.max_seconds:g} s"
        )
    frames = int(stream.frames or 0) or max(1, round(seconds * fps))
    if frames > limits.max_frames:
        raise MediaError(
            field, f"{field!r} declares {frames} frames; the limit is {limits.max_frames} frames"
        )
    audio = _audio_track(opened.streams.audio[0], opened, field) if opened.streams.audio else None
    return VideoInfo(kind, codec, width, height, frames, fps, seconds, audio)


def _audio_track(stream: Any, opened: Any, field: str) -> AudioTrack:
    codec = stream.codec_context.name
    if codec not in AUDIO_CODECS:
        raise MediaError(
            field,
            f"{field!r}: its sound track is {codec!r}; accepted: {', '.join(AUDIO_CODECS)}",
        )
    rate = int(stream.codec_context.sample_rate or 0)
    channels = int(stream.codec_context.layout.nb_channels or 0)
    seconds = _seconds(stream, opened) or 0.0
    return AudioTrack(codec, rate, channels, seconds)


def _seconds(stream: Any, opened: Any) -> float | None:
    """The stream's duration, else the container's, in seconds; None if neither says."""
    if stream.duration is not None and stream.time_base:
        return float(stream.duration * stream.time_base)
    if opened.duration is not None:
        return opened.duration / 1_000_000
    return None


def _pyav() -> Any:
    try:
        import av
    except ImportError:
        raise OmniError(
            "this server cannot read video: the PyAV package is not installed",
            hint="pip install av",
        ) from None
    return av


def _names() -> str:
    return "MP4/MOV, Matroska/WebM or AVI"
