"""The bounded audio decoder: limits from the header first, and a read that cannot outgrow them.

The memory tests run the decoder in a fresh interpreter and compare its peak
resident size (``ru_maxrss``) before and after, so that nothing this pytest
process allocated earlier can hide or fake the growth.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

soundfile = pytest.importorskip("soundfile")

from omni_core.media import (  # noqa: E402
    AudioLimits,
    MediaError,
    decode_audio,
    decode_base64_audio,
    probe_audio,
)

HOUR = 3600
RATE = 16_000  # an hour of it decodes to 230 MB of float32: growth would be obvious
FLAC_TOTAL = 18  # byte offset of STREAMINFO's packed rate/channels/bits/total-samples field


def silent_flac(seconds: int, rate: int = RATE) -> bytes:
    """``seconds`` of silence as FLAC, written a minute at a time (never all in memory)."""
    out = io.BytesIO()
    block = np.zeros(rate * 60, dtype=np.int16)
    with soundfile.SoundFile(out, "w", rate, 1, format="FLAC", subtype="PCM_16") as sound:
        for _ in range(seconds // 60):
            sound.write(block)
        sound.write(block[: rate * (seconds % 60)])
    return out.getvalue()


def with_total_samples(flac: bytes, total: int) -> bytes:
    """The same FLAC whose STREAMINFO claims ``total`` samples (0 means "unknown")."""
    data = bytearray(flac)
    assert data[:4] == b"fLaC"
    field = int.from_bytes(data[FLAC_TOTAL : FLAC_TOTAL + 8], "big")
    field = (field & ~((1 << 36) - 1)) | total
    data[FLAC_TOTAL : FLAC_TOTAL + 8] = field.to_bytes(8, "big")
    return bytes(data)


def wav(samples: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=fmt, subtype="PCM_16")
    return out.getvalue()


def wav_header(rate: int, channels: int, frames: int) -> bytes:
    """A PCM16 WAV with whatever rate and channel count it is told to claim."""
    data = b"\0" * (frames * channels * 2)
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    chunks = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data"
    chunks += struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(chunks)) + chunks


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


LIMITS = AudioLimits(max_seconds=30, min_seconds=0.5)


@pytest.mark.parametrize("fmt", ["WAV", "FLAC"])
def test_a_valid_clip_decodes_to_its_samples(fmt):
    t = np.arange(RATE * 2) / RATE
    stereo = np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.25 * np.sin(2 * np.pi * 220 * t)], 1)
    clip = decode_base64_audio(b64(wav(stereo, RATE, fmt)), "ref_audio", LIMITS)
    assert clip.rate == RATE and clip.format == fmt.lower()
    assert clip.samples.shape == (RATE * 2, 2) and clip.samples.dtype == np.float32
    assert np.abs(clip.samples - stereo).max() < 1e-4  # PCM16 quantisation only
    assert clip.seconds == 2.0


@pytest.mark.parametrize(
    ("encoded", "message"),
    [
        (["not", "a", "string"], "'ref_audio' must be a base64 string of a wav, flac, ogg or mp3"),
        ("/etc/passwd", "'ref_audio' is not readable audio: it is not valid base64"),
        ("@@@@", "it is not valid base64"),
        (b64(b"just some text, not audio"), "it is not a wav, flac, ogg or mp3 file"),
        (b64(b"RIFF\x10\x00\x00\x00WAVEfmt "), "'ref_audio' is not readable audio:"),
        (b64(wav_header(1_000_000, 1, 100)), "sample rate of 1000000 Hz; accepted: 1000-192000"),
        (b64(wav_header(16_000, 64, 100)), "has 64 channels; accepted: 1-8"),
        (b64(wav_header(16_000, 1, 31 * 16_000)), "is 31.0 s long; the limit is 30 s"),
        (b64(wav_header(16_000, 1, 4_000)), "is 0.25 s long; give at least 0.5 s"),
    ],
)
def test_bad_input_is_refused_naming_the_field(encoded, message):
    with pytest.raises(MediaError) as caught:
        decode_base64_audio(encoded, "ref_audio", LIMITS)
    assert message in caught.value.message
    assert caught.value.field == "ref_audio"


def test_the_encoded_size_is_checked_before_base64_is_decoded():
    limits = AudioLimits(max_bytes=1000)
    with pytest.raises(MediaError, match="the limit is 1000 bytes"):
        decode_base64_audio("A" * 4000, "clip", limits)
    with pytest.raises(MediaError, match="the limit is 1000 bytes"):
        decode_audio(b"\0" * 1001, "clip", limits)


def test_the_sample_cap_holds_when_rate_and_length_pass():
    limits = AudioLimits(max_seconds=30, max_samples=8 * 16_000)  # 8 s of mono at 16 kHz
    with pytest.raises(MediaError, match=r"holds 160000 samples; the limit is 128000 samples"):
        decode_audio(wav_header(16_000, 1, 10 * 16_000), "clip", limits)


def test_a_header_that_claims_less_than_the_data_reads_only_what_it_claims():
    lying = with_total_samples(silent_flac(120), RATE)  # says 1 s, holds 2 min
    clip = decode_audio(lying, "clip", LIMITS)
    assert clip.samples.shape[0] <= 30 * RATE
    assert clip.samples.shape[0] == RATE


def test_a_header_without_a_length_is_cut_off_at_the_cap():
    unknown = with_total_samples(silent_flac(120), 0)  # 0: "length not known"
    with pytest.raises(MediaError, match=r"longer than the limit of 30 s \(found while decoding"):
        decode_audio(unknown, "clip", LIMITS)


MEMORY_PROBE = textwrap.dedent(
    """
    import base64, json, resource, sys
    import numpy, soundfile
    from omni_core.media import AudioLimits, MediaError, decode_audio, decode_base64_audio

    limits = AudioLimits(max_seconds=30, min_seconds=0.5)
    warm = open(sys.argv[2], "rb").read()
    decode_audio(warm, "warm-up", limits)  # libsndfile's own first-use allocations
    encoded = base64.b64encode(open(sys.argv[1], "rb").read()).decode()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcome = {}
    try:
        clip = decode_base64_audio(encoded, "ref_audio", limits)
        outcome["frames"] = int(clip.samples.shape[0])
    except MediaError as exc:
        outcome["refused"] = exc.message
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({**outcome, "grew_kib": grew}))
    """
)


@pytest.mark.parametrize(
    ("total", "expect"),
    [
        (None, "is 3600.0 s long; the limit is 30 s"),  # the header tells the truth
        (0, "longer than the limit of 30 s"),  # the header does not say
        (RATE, RATE),  # the header claims 1 s: only 1 s is read
    ],
)
def test_an_hour_of_flac_never_decodes_into_memory(tmp_path: Path, total, expect):
    flac = silent_flac(HOUR)
    assert len(flac) < 2_000_000  # the attack is small on the wire
    if total is not None:
        flac = with_total_samples(flac, total)
    (tmp_path / "hour.flac").write_bytes(flac)
    (tmp_path / "warm.wav").write_bytes(wav(np.zeros(RATE), RATE))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            MEMORY_PROBE,
            str(tmp_path / "hour.flac"),
            str(tmp_path / "warm.wav"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if isinstance(expect, str):
        assert expect in report["refused"]
    else:
        assert report["frames"] == expect
    # Decoding the hour would take 230 MB; the bounded read takes at most 30 s (1.9 MB).
    assert report["grew_kib"] < 20 * 1024, report


def test_importing_the_media_package_loads_no_numpy_or_soundfile():
    code = (
        "import sys, omni_core.media, omni_core.media.remote\n"
        "print(sorted(m for m in ('numpy', 'soundfile') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_probe_gives_the_length_from_the_header_and_refuses_as_decoding_would(monkeypatch):
    import soundfile

    raw = silent_flac(3)
    monkeypatch.setattr(soundfile.SoundFile, "read", lambda *a, **k: pytest.fail("decoded"))
    assert probe_audio(raw, "f", AudioLimits(max_seconds=10)) == pytest.approx(3.0)
    with pytest.raises(MediaError, match=r"3\.0 s long; the limit is 2 s"):
        probe_audio(raw, "f", AudioLimits(max_seconds=2))
    # a header that does not state its length counts as the limit (the decode stops there)
    unknown = with_total_samples(raw, 0)
    assert probe_audio(unknown, "f", AudioLimits(max_seconds=10)) == pytest.approx(10.0)
