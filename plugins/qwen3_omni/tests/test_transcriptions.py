"""/v1/audio/transcriptions and /translations on qwen3-omni-text, through the official client.

One server (the demo deploy file: tiny preset, dummy weights, CPU) for the
module. The transcript of random weights is meaningless, but it is greedy,
so every response format of one clip must carry the same text, and the
stream's deltas must join to it.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from media_samples import wav_bytes  # noqa: E402

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_omni_text_demo.toml"
FLAGS = [
    *("--preprocessing.factory.max_tokens", "8"),  # short answers, fast tests
    *("--preprocessing.factory.max_audio_seconds", "20"),  # the stage's own cap, below ours
]


@pytest.fixture(scope="module")
def server():
    with short_private_dir() as base:
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=FLAGS)
        with planned.serve() as live:
            yield live


@pytest.fixture(scope="module")
def tone() -> bytes:
    return wav_bytes(1.5, pitch=330.0)


def _transcribe(server, audio: bytes, name: str = "clip.wav", **kw):
    return server.client().audio.transcriptions.create(
        model="tiny", file=(name, io.BytesIO(audio)), **kw
    )


def test_every_response_format_carries_the_same_greedy_transcript(server, tone):
    whole = _transcribe(server, tone)
    assert isinstance(whole.text, str) and whole.text
    assert whole.usage.type == "tokens" and whole.usage.input_tokens > 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    assert _transcribe(server, tone, response_format="text") == whole.text
    srt = _transcribe(server, tone, response_format="srt")
    assert srt == f"1\n00:00:00,000 --> 00:00:01,500\n{whole.text}\n\n"
    vtt = _transcribe(server, tone, response_format="vtt")
    assert vtt == f"WEBVTT\n\n00:00:00.000 --> 00:00:01.500\n{whole.text}\n\n"
    verbose = _transcribe(server, tone, response_format="verbose_json")
    assert (verbose.task, verbose.language, verbose.text) == ("transcribe", "unknown", whole.text)
    assert verbose.duration == pytest.approx(1.5)
    (segment,) = verbose.segments
    assert (segment.id, segment.start, segment.end) == (0, 0.0, pytest.approx(1.5))
    assert segment.text == whole.text and segment.temperature == 0.0
    assert segment.compression_ratio > 0
    hinted = _transcribe(server, tone, response_format="verbose_json", language="en", prompt="Hi")
    assert hinted.language == "en" and hinted.text


def test_the_stream_sends_deltas_that_join_to_the_done_text(server, tone):
    whole = _transcribe(server, tone)
    deltas, done = [], []
    for event in _transcribe(server, tone, stream=True):
        if event.type == "transcript.text.delta":
            deltas.append(event.delta)
        elif event.type == "transcript.text.done":
            done.append(event)
    assert len(deltas) >= 2  # streamed piece by piece, not one event at the end
    assert len(done) == 1 and "".join(deltas) == done[0].text == whole.text
    assert done[0].usage.output_tokens == whole.usage.output_tokens


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks translations so
def test_a_translation_is_a_translate_task_in_english(server, tone):
    client = server.client()
    plain = client.audio.translations.create(model="tiny", file=("c.wav", io.BytesIO(tone)))
    assert isinstance(plain.text, str) and plain.text
    verbose = client.audio.translations.create(
        model="tiny", file=("c.wav", io.BytesIO(tone)), response_format="verbose_json"
    )
    assert (verbose.task, verbose.language, verbose.text) == ("translate", "english", plain.text)
    with pytest.raises(openai.BadRequestError) as caught:  # translations take no language
        client.audio.translations.create(
            model="tiny", file=("c.wav", io.BytesIO(tone)), extra_body={"language": "de"}
        )
    assert caught.value.body["param"] == "language"


def test_a_format_only_ffmpeg_reads_is_transcoded_and_timed(server):
    import av
    import numpy as np

    out = io.BytesIO()
    with av.open(out, mode="w", format="matroska") as container:
        stream = container.add_stream("libopus", rate=48000, layout="mono")
        t = np.arange(48000 * 2) / 48000
        samples = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)[None, :]
        frame = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
        frame.sample_rate = 48000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    verbose = _transcribe(server, out.getvalue(), "clip.webm", response_format="verbose_json")
    assert verbose.duration == pytest.approx(2.0, abs=0.05) and verbose.text


@pytest.mark.parametrize(
    ("audio", "expected"),
    [(b"this is not audio at all", "not readable audio"), (b"", "empty")],
    ids=["garbage", "empty"],
)
def test_an_undecodable_file_is_a_400_about_file(server, audio, expected):
    with pytest.raises(openai.BadRequestError) as caught:
        _transcribe(server, audio, "clip.m4a")
    assert caught.value.body["param"] == "file"
    assert expected in caught.value.body["message"]


def test_the_stages_own_audio_cap_is_a_400_about_file(server):
    with pytest.raises(openai.BadRequestError) as caught:
        _transcribe(server, wav_bytes(21.0, rate=8000))
    body = caught.value.body
    assert body["param"] == "file" and "'file' is 21.0 s long" in body["message"]
    assert "messages." not in body["message"]  # no field the client never sent


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": "mp3"}, "response_format"),
        ({"temperature": 3}, "temperature"),
        ({"stream": True, "response_format": "srt"}, "stream"),
        ({"timestamp_granularities": ["word"]}, "timestamp_granularities"),
        (  # verbose_json: accepted, but this pipeline times no words
            {"timestamp_granularities": ["word"], "response_format": "verbose_json"},
            "timestamp_granularities",
        ),
        ({"extra_body": {"voice": "x"}}, "voice"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(server, tone, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        _transcribe(server, tone, **fields)
    assert caught.value.body["param"] == param


def test_an_unknown_model_is_a_404(server, tone):
    with pytest.raises(openai.NotFoundError) as caught:
        server.client().audio.transcriptions.create(
            model="whisper-9", file=("c.wav", io.BytesIO(tone))
        )
    assert caught.value.body["param"] == "model"


def test_real_speech_from_espeak_is_transcribed(server, tmp_path):
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng) to speak the input")
    path = tmp_path / "hello.wav"
    subprocess.run([espeak, "-w", str(path), "hello world"], check=True, timeout=30)
    import soundfile

    seconds = soundfile.info(str(path)).duration
    with path.open("rb") as file:
        verbose = server.client().audio.transcriptions.create(
            model="tiny", file=file, response_format="verbose_json"
        )
    assert verbose.duration == pytest.approx(seconds, abs=0.001)
    assert verbose.text and json.dumps(verbose.segments[0].model_dump())
