"""The bounded video reader: container by magic bytes, limits from the header, then frames."""

from __future__ import annotations

import fractions
import io
import subprocess
import sys
import textwrap

import numpy as np
import pytest

av = pytest.importorskip("av")

from omni_core.media import AudioLimits, MediaError, VideoLimits  # noqa: E402
from omni_core.media.video_input import (  # noqa: E402
    decode_video_audio,
    decode_video_frames,
    probe_video,
    sniff_video,
)

FIELD = "messages.0.content.0.video_url.url"


def clip(
    width: int = 64,
    height: int = 48,
    frames: int = 10,
    rate: int = 10,
    *,
    pts_step: int = 1,
    audio_seconds: float | None = None,
    fmt: str = "mp4",
    codec: str = "libx264",
) -> bytes:
    """Frame k is a flat grey of level 20 k (exact enough through H.264 to tell frames apart)."""
    out = io.BytesIO()
    with av.open(out, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = fractions.Fraction(1, rate)
        sound = None
        if audio_seconds is not None:
            sound = container.add_stream("aac", rate=16000, layout="mono")
        for k in range(frames):
            level = np.full((height, width, 3), (20 * k) % 250, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(level, format="rgb24")
            frame.pts = k * pts_step
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            t = np.arange(int(16000 * audio_seconds)) / 16000
            tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None]
            for start in range(0, tone.shape[1], 1024):
                block = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(tone[:, start : start + 1024]), format="flt", layout="mono"
                )
                block.sample_rate, block.pts = 16000, start
                for packet in sound.encode(block):
                    container.mux(packet)
            for packet in sound.encode():
                container.mux(packet)
    return out.getvalue()


def test_the_header_is_read_without_decoding():
    info = probe_video(clip(), FIELD, VideoLimits())
    assert (info.container, info.codec, info.width, info.height) == ("mp4", "h264", 64, 48)
    assert info.frames == 10 and info.fps == pytest.approx(10.0)
    assert info.seconds == pytest.approx(1.0, abs=0.05)
    assert info.audio is None


def test_sound_track_is_described_and_decoded_as_16_bit():
    raw = clip(audio_seconds=1.0)
    info = probe_video(raw, FIELD, VideoLimits())
    assert info.audio is not None and (info.audio.codec, info.audio.rate) == ("aac", 16000)
    decoded = decode_video_audio(raw, FIELD, AudioLimits(), VideoLimits())
    assert decoded is not None and decoded.rate == 16000 and decoded.samples.shape[1] == 1
    assert decoded.seconds == pytest.approx(1.0, abs=0.1)
    # Every sample is a multiple of 1/32768: the track went through 16-bit PCM.
    scaled = decoded.samples * 32768
    assert np.array_equal(scaled, np.round(scaled))
    assert 0.2 < float(np.abs(decoded.samples).max()) < 0.4
    assert decode_video_audio(clip(), FIELD, AudioLimits(), VideoLimits()) is None


def test_sound_track_longer_than_the_audio_limit_is_refused():
    raw = clip(audio_seconds=2.0)
    with pytest.raises(MediaError, match=r"sound track is 2\.0 s long; the limit is 1 s"):
        decode_video_audio(raw, FIELD, AudioLimits(max_seconds=1.0), VideoLimits())


def test_only_the_wanted_frames_come_back_in_the_order_asked():
    raw = clip()
    frames = decode_video_frames(raw, FIELD, VideoLimits(), [0, 3, 9, 3])
    levels = [int(np.median(f)) for f in frames]
    assert np.abs(np.array(levels) - [0, 60, 180, 60]).max() <= 3, levels
    assert frames[0].shape == (48, 64, 3) and frames[0].dtype == np.uint8


def test_convert_runs_on_each_kept_frame_only():
    seen = []

    def halve(pixels):
        seen.append(pixels.shape)
        return pixels[::2, ::2]

    frames = decode_video_frames(clip(), FIELD, VideoLimits(), [1, 2], convert=halve)
    assert len(seen) == 2 and frames[0].shape == (24, 32, 3)


def test_indices_past_the_end_repeat_the_last_frame():
    frames = decode_video_frames(clip(frames=4), FIELD, VideoLimits(), [0, 3, 7])
    assert np.array_equal(frames[1], frames[2])


@pytest.mark.parametrize(
    ("raw", "limits", "message"),
    [
        (clip(), VideoLimits(max_bytes=100), "bytes; the limit is 100 bytes"),
        (
            clip(),
            VideoLimits(max_pixels=1000),
            "64 x 48 = 3072 pixels per frame; the limit is 1000",
        ),
        (clip(), VideoLimits(max_side=50), "no side may exceed 50"),
        (clip(), VideoLimits(max_frames=5), "declares 10 frames; the limit is 5 frames"),
        (clip(), VideoLimits(max_seconds=0.5), "s long; the limit is 0.5 s"),
        (clip(), VideoLimits(max_rate=5), "declares 10 frames per second"),
        (clip(frames=2, pts_step=10 * 3600 * 10), VideoLimits(), "36000.1 s long"),
    ],
)
def test_limits_are_checked_from_the_header(raw, limits, message):
    with pytest.raises(MediaError, match=message) as caught:
        probe_video(raw, FIELD, limits)
    assert caught.value.field == FIELD
    with pytest.raises(MediaError, match=message):
        decode_video_frames(raw, FIELD, limits, [0])


def test_not_a_video_and_a_damaged_one_are_refused_by_name():
    assert sniff_video(b"\x89PNG\r\n\x1a\n0000") is None
    with pytest.raises(MediaError, match="is not a readable video: it is not a MP4/MOV"):
        probe_video(b"RIFF0000WAVEfmt " + bytes(64), FIELD, VideoLimits())
    raw = clip()
    with pytest.raises(MediaError, match="is not a readable MP4 video: its header is damaged"):
        probe_video(raw[:200], FIELD, VideoLimits())
    # A valid header whose frame data is garbage: refused while decoding, never a crash.
    broken = bytearray(raw)
    mdat = broken.find(b"mdat")
    broken[mdat + 4 : mdat + 400] = bytes(range(256)) + bytes(140)
    try:
        frames = decode_video_frames(bytes(broken), FIELD, VideoLimits(), [0, 9])
    except MediaError as exc:
        assert "not a decodable video" in exc.message
    else:  # FFmpeg conceals some damage; then the frames still have the right shape
        assert frames[0].shape == (48, 64, 3)


def test_webm_reads_like_mp4():
    raw = clip(fmt="webm", codec="libvpx")
    assert sniff_video(raw) == "matroska"
    info = probe_video(raw, FIELD, VideoLimits())
    assert info.codec == "vp8" and info.frames == 10
    assert len(decode_video_frames(raw, FIELD, VideoLimits(), [0, 9])) == 2


BOMB = textwrap.dedent(
    """
    import io, resource, sys, fractions
    import av, numpy as np
    from omni_core.media import MediaError, VideoLimits
    from omni_core.media.video_input import probe_video, decode_video_frames
    raw = sys.stdin.buffer.read()
    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    before = peak()
    for call in (probe_video, lambda r, f, l: decode_video_frames(r, f, l, [0])):
        try:
            call(raw, "v", VideoLimits())
        except MediaError as exc:
            print("refused:", exc.message)
    print("grew_mb", peak() - before)
    """
)


def _bomb(width: int, height: int, frames: int, pts_step: int = 1) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = fractions.Fraction(1, 25)
        black = av.VideoFrame(width, height, "yuv420p")
        for plane in black.planes:
            plane.update(bytes(plane.buffer_size))
        for k in range(frames):
            black.pts = k * pts_step
            for packet in stream.encode(black):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


@pytest.mark.parametrize(
    ("width", "height", "frames", "pts_step", "refusal"),
    [
        (7680, 4320, 1, 1, "7680 x 4320 = 33177600 pixels per frame"),
        (64, 48, 2, 25 * 3600 * 10, "36000.0 s long; the limit is 600 s"),
    ],
)
def test_a_video_bomb_is_refused_before_decoding(width, height, frames, pts_step, refusal):
    raw = _bomb(width, height, frames, pts_step)
    assert len(raw) < 20_000  # a tiny file
    proc = subprocess.run([sys.executable, "-c", BOMB], input=raw, capture_output=True, timeout=120)
    out = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert out.count("refused:") == 2 and refusal in out, out
    grew = float(out.split("grew_mb")[1])
    assert grew < 20, out
