"""Every speech format, streamed and not; SSE events; speed; sample_rate (issue 15).

The test pipeline ``t-speech`` emits a known signal (a 220 Hz sine for
alice, one 50 ms chunk per word), so what comes back is checked against it
with decoders that are not ours: soundfile for wav and flac, PyAV's decoders
for mp3, opus and aac. Durations must agree within one 1920-sample frame at
24 kHz (scaled to the output rate), plus, for the lossy codecs, their
priming and padding (AAC in ADTS cannot signal either: up to two 1024-sample
frames). The qwen3-tts tiny demo checks mp3 and opus end to end.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import openai
import pytest
import soundfile
from omni_test_speech import CHUNK_SAMPLES, SAMPLE_RATE, VOICES, sine

from omni_core.serve.audio.encoders import StreamEncoder, atempo_factors, encode_whole
from omni_core.serve.audio.pcm import to_pcm16
from omni_core.serve.common.errors import APIError
from omni_core.serve.speech.routes import _events

av = pytest.importorskip("av")

WORDS = 20
TEXT = " ".join(["word"] * WORDS)  # 20 chunks of 50 ms: one second
SAMPLES = WORDS * CHUNK_SAMPLES
FRAME = 1920  # one speech-codec frame at 24 kHz: the duration tolerance
LOSSY_PADDING = 2048  # samples at the output rate: AAC's priming plus its last frame's padding
FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
LOSSLESS = ("wav", "pcm", "flac")
MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
}
NATIVE_RATE = {"opus": 48000}


def reference_pcm(voice: str = "alice", words: int = WORDS) -> bytes:
    """What t-speech sends for ``words`` words, as the server's PCM16."""
    return b"".join(to_pcm16(sine(VOICES[voice], index)) for index in range(words))


def decode(data: bytes, fmt: str, pcm_rate: int = SAMPLE_RATE) -> tuple[np.ndarray, int]:
    """Samples (int16 for the lossless formats, float32 otherwise) and the rate, by other code."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2"), pcm_rate
    if fmt == "wav" or (fmt == "flac" and flac_total_samples(data)):
        samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
        return samples, rate
    # PyAV for the rest, and for a streamed FLAC: libsndfile fails at the end of one
    # whose STREAMINFO leaves the length unstated (0), which the FLAC format allows
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        rate = stream.codec_context.sample_rate
    samples = np.concatenate(frames)
    return (samples if fmt == "flac" else samples.astype(np.float32)), rate


def flac_total_samples(data: bytes) -> int:
    """The 36-bit total-samples field of FLAC's STREAMINFO (bytes 18-25 of the file)."""
    assert data[:4] == b"fLaC"
    return int.from_bytes(data[18:26], "big") & (2**36 - 1)


def tolerance(fmt: str, rate: int) -> float:
    """One frame at ``rate``, plus a lossy codec's priming and padding."""
    return FRAME * rate / SAMPLE_RATE + (0 if fmt in LOSSLESS else LOSSY_PADDING)


def dominant_frequency(signal: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(np.asarray(signal, dtype=np.float64)))
    return float(np.fft.rfftfreq(len(signal), 1 / rate)[spectrum.argmax()])


def speak(server: Any, fmt: str, *, stream: bool, **extra: Any) -> tuple[bytes, Any]:
    """The body and headers of one speech request for ``TEXT`` in alice's voice."""
    speech = server.client().audio.speech
    request = {"model": "t-speech", "input": extra.pop("input", TEXT), "voice": "alice"}
    if stream:
        with speech.with_streaming_response.create(
            **request, response_format=fmt, extra_body={"stream": True, **extra}
        ) as response:
            return b"".join(response.iter_bytes()), response.headers
    response = speech.with_raw_response.create(**request, response_format=fmt, extra_body=extra)
    return response.content, response.headers


def sse_events(server: Any, fmt: str, **extra: Any) -> tuple[list[dict[str, Any]], Any]:
    with server.client().audio.speech.with_streaming_response.create(
        model="t-speech",
        input=TEXT,
        voice="alice",
        response_format=fmt,
        stream_format="sse",
        extra_body=extra,
    ) as response:
        lines = list(response.iter_lines())
        headers = response.headers
    return [json.loads(line.removeprefix("data: ")) for line in lines if line], headers


# -- every format, whole and streamed ---------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_decodes_to_the_signal_s_duration_and_pitch(speech_server, fmt, streamed):
    data, headers = speak(speech_server, fmt, stream=streamed)
    assert headers["content-type"] == MEDIA_TYPES[fmt]
    if streamed:
        assert "content-length" not in headers  # chunked: really streamed
    else:
        assert headers["x-omni-finish-reason"] == "stop"
    signal, rate = decode(data, fmt)
    assert rate == NATIVE_RATE.get(fmt, SAMPLE_RATE)
    assert abs(len(signal) - SAMPLES * rate / SAMPLE_RATE) <= tolerance(fmt, rate)
    assert abs(dominant_frequency(signal, rate) - VOICES["alice"]) < 3


@pytest.mark.parametrize("fmt", LOSSLESS)
def test_lossless_formats_streamed_and_whole_are_the_pipeline_s_samples(speech_server, fmt):
    whole, _ = decode(speak(speech_server, fmt, stream=False)[0], fmt)
    streamed, _ = decode(speak(speech_server, fmt, stream=True)[0], fmt)
    assert whole.tobytes() == streamed.tobytes() == reference_pcm()


def test_a_whole_flac_states_its_length_and_a_streamed_one_says_unknown(speech_server):
    for streamed, total in ((False, SAMPLES), (True, 0)):
        assert flac_total_samples(speak(speech_server, "flac", stream=streamed)[0]) == total


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_lossy_formats_streamed_and_whole_agree_in_duration(speech_server, fmt):
    whole, rate = decode(speak(speech_server, fmt, stream=False)[0], fmt)
    streamed, _ = decode(speak(speech_server, fmt, stream=True)[0], fmt)
    assert abs(len(whole) - len(streamed)) <= tolerance(fmt, rate)


# -- SSE --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "wav"])
def test_sse_deltas_concatenate_to_a_valid_stream_and_done_has_the_usage(speech_server, fmt):
    events, headers = sse_events(speech_server, fmt)
    assert headers["content-type"].startswith("text/event-stream")
    *deltas, done = events
    assert len(deltas) > 1 and {event["type"] for event in deltas} == {"speech.audio.delta"}
    # t-speech's audio stage counts a chunk as a token and its prompt as none
    usage = {"input_tokens": 0, "output_tokens": WORDS, "total_tokens": WORDS}
    assert done == {"type": "speech.audio.done", "usage": usage, "finish_reason": "stop"}
    audio = b"".join(base64.b64decode(event["audio"]) for event in deltas)
    signal, rate = decode(audio, fmt)
    assert abs(len(signal) - SAMPLES * rate / SAMPLE_RATE) <= tolerance(fmt, rate)
    if fmt in LOSSLESS:
        assert signal.tobytes() == reference_pcm()


def test_sse_events_parse_with_the_openai_client_s_own_decoder(speech_server):
    stream = speech_server.client().post(
        "/audio/speech",
        body={"model": "t-speech", "input": TEXT, "voice": "alice", "stream_format": "sse"},
        cast_to=object,
        stream=True,
        stream_cls=openai.Stream[object],
    )
    events = list(stream)
    assert events[-1]["type"] == "speech.audio.done"
    wav = b"".join(base64.b64decode(event["audio"]) for event in events[:-1])
    assert decode(wav, "wav")[0].tobytes() == reference_pcm()


def test_a_failure_after_the_sse_stream_started_is_an_error_event():
    async def audio() -> Any:
        yield b"RIFF"
        raise APIError(504, "the request did not finish in 1 s (runtime.request_timeout)")

    async def events() -> list[dict[str, Any]]:
        return [json.loads(event[len(b"data: ") :]) async for event in _events(audio(), {})]

    delta, error = anyio.run(events)
    assert delta == {"type": "speech.audio.delta", "audio": base64.b64encode(b"RIFF").decode()}
    assert error["type"] == "error"
    assert "runtime.request_timeout" in error["error"]["message"]


def test_a_client_that_leaves_an_sse_stream_midway_aborts_its_request(speech_server):
    coordinator = speech_server.runtime.coordinator
    host, port = speech_server.url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    body = {
        "input": "word " * 50,
        "voice": "alice",
        "response_format": "mp3",
        "stream_format": "sse",
        "test_chunk_delay": 0.2,
    }
    connection.request(
        "POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # streaming has begun; the rest takes 10 s
    assert coordinator.inflight == 1
    connection.close()
    deadline = time.monotonic() + 3
    while coordinator.inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert coordinator.inflight == 0


# -- speed and sample_rate ---------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "speed", "streamed"),
    [("wav", 2.0, False), ("wav", 2.0, True), ("wav", 0.5, False), ("mp3", 2.0, True)],
)
def test_speed_changes_the_duration_and_keeps_the_pitch(speech_server, fmt, speed, streamed):
    data, _ = speak(speech_server, fmt, stream=streamed, speed=speed)
    signal, rate = decode(data, fmt)
    assert rate == SAMPLE_RATE
    assert abs(len(signal) - SAMPLES / speed) <= tolerance(fmt, rate)
    assert abs(dominant_frequency(signal, rate) - VOICES["alice"]) < 3


@pytest.mark.parametrize(("fmt", "streamed"), [("wav", False), ("pcm", True), ("mp3", False)])
def test_sample_rate_resamples_the_output(speech_server, fmt, streamed):
    data, _ = speak(speech_server, fmt, stream=streamed, sample_rate=16000)
    signal, rate = decode(data, fmt, pcm_rate=16000)
    assert rate == 16000
    assert abs(len(signal) - SAMPLES * 16000 / SAMPLE_RATE) <= tolerance(fmt, 16000)
    assert abs(dominant_frequency(signal, rate) - VOICES["alice"]) < 3


def test_speed_and_sample_rate_together(speech_server):
    data, _ = speak(speech_server, "flac", stream=True, speed=1.5, sample_rate=8000)
    signal, rate = decode(data, "flac")
    assert rate == 8000
    assert abs(len(signal) - SAMPLES / 1.5 / 3) <= tolerance("flac", 8000)


# -- refusals ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"response_format": "ogg"}, "response_format", "'opus' or 'aac', got 'ogg'"),
        ({"speed": 5}, "speed", "less than or equal to 4"),
        ({"speed": 0.1}, "speed", "greater than or equal to 0.25"),
        ({"speed": "2"}, "speed", "valid number"),
        ({"sample_rate": 1000}, "sample_rate", "greater than or equal to 8000"),
        ({"sample_rate": 96000}, "sample_rate", "less than or equal to 48000"),
        ({"sample_rate": 16000.5}, "sample_rate", "valid integer"),
        ({"response_format": "opus", "sample_rate": 16000}, "sample_rate", "always encoded at"),
        ({"response_format": "mp3", "sample_rate": 10000}, "sample_rate", "send one of 8000"),
        ({"stream_format": "json"}, "stream_format", "'audio' or 'sse', got 'json'"),
    ],
)
def test_bad_values_get_400_naming_the_field(speech_server, extra, param, message):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            speech_server.client().post(
                "/audio/speech",
                body={"model": "t-speech", "input": "hi", "stream": stream, **extra},
                cast_to=bytes,
            )
        assert caught.value.param == param
        assert message in caught.value.message


def test_without_pyav_wav_and_pcm_still_work_and_the_rest_name_the_fix(speech_server, monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)  # ``import av`` raises ImportError
    wav, _ = speak(speech_server, "wav", stream=True)
    assert decode(wav, "wav")[0].tobytes() == reference_pcm()
    refused = [
        ({"response_format": "mp3"}, "response_format"),
        ({"response_format": "flac"}, "response_format"),
        ({"speed": 2.0}, "speed"),
        ({"sample_rate": 16000}, "sample_rate"),
    ]
    for extra, param in refused:
        with pytest.raises(openai.BadRequestError) as caught:
            speech_server.client().post(
                "/audio/speech", body={"input": "hi", **extra}, cast_to=bytes
            )
        assert caught.value.param == param
        assert "pip install av" in caught.value.message


# -- chat completions' audio.format ------------------------------------------------


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_chat_audio_comes_in_the_asked_format(chat_server, fmt):
    reply = chat_server.client().chat.completions.create(
        model="t-chat",
        messages=[{"role": "user", "content": "one two three"}],
        modalities=["text", "audio"],
        audio={"voice": "alice", "format": fmt},
    )
    words = len(reply.choices[0].message.content.split())  # the talker: one chunk a word
    signal, rate = decode(base64.b64decode(reply.choices[0].message.audio.data), fmt)
    assert rate == NATIVE_RATE.get(fmt, SAMPLE_RATE)
    assert abs(len(signal) - words * CHUNK_SAMPLES * rate / SAMPLE_RATE) <= tolerance(fmt, rate)


def test_chat_refuses_an_unknown_audio_format_naming_it(chat_server):
    with pytest.raises(openai.BadRequestError) as caught:
        chat_server.client().chat.completions.create(
            model="t-chat",
            messages=[{"role": "user", "content": "hi"}],
            modalities=["text", "audio"],
            audio={"voice": "alice", "format": "ogg"},
        )
    assert caught.value.param == "audio.format"


# -- the encoders themselves -------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_streaming_encoder_lets_bytes_out_with_the_first_chunk(fmt):
    """A 4-frame chunk (320 ms) must not be held back: streaming means bytes now."""
    pcm = reference_pcm(words=8)
    encoder = StreamEncoder(fmt, SAMPLE_RATE)
    first = encoder.feed(pcm[: 2 * 4 * FRAME])
    assert first
    rest = encoder.feed(pcm[2 * 4 * FRAME :]) + encoder.flush()
    signal, rate = decode(first + rest, fmt)
    assert abs(len(signal) - 8 * CHUNK_SAMPLES * rate / SAMPLE_RATE) <= tolerance(fmt, rate)


def test_float_chunks_are_encoded_like_their_pcm16():
    chunk = sine(220.0, 0)
    encoder = StreamEncoder("pcm", SAMPLE_RATE, streaming=True)
    assert encoder.feed(chunk) + encoder.flush() == to_pcm16(chunk)
    assert encode_whole(to_pcm16(chunk), "pcm", SAMPLE_RATE) == to_pcm16(chunk)


@pytest.mark.parametrize(
    ("speed", "factors"),
    [(1.5, [1.5]), (2.0, [2.0]), (4.0, [2.0, 2.0]), (0.25, [0.5, 0.5]), (0.5, [0.5])],
)
def test_atempo_is_chained_within_its_range(speed, factors):
    assert atempo_factors(speed) == pytest.approx(factors)
    assert atempo_factors(3.0) == pytest.approx([3**0.5, 3**0.5])


def test_an_encoder_refuses_what_it_cannot_make_before_any_audio():
    for kwargs, param in (
        ({"fmt": "ogg"}, "response_format"),
        ({"fmt": "wav", "speed": 8.0}, "speed"),
        ({"fmt": "aac", "out_rate": 9000}, "sample_rate"),
    ):
        with pytest.raises(APIError) as caught:
            StreamEncoder(in_rate=SAMPLE_RATE, **kwargs)
        assert caught.value.status == 400 and caught.value.param == param


# -- end to end: the qwen3-tts tiny demo -------------------------------------------

DEMO = Path(__file__).resolve().parents[2] / "examples" / "qwen3_tts_demo.toml"


@pytest.fixture(scope="module")
def qwen3_tts():
    pytest.importorskip("omni_qwen3_tts")
    from omni_core.plugins import OmniPlugins
    from omni_core.testing import plan_on_cpu, short_private_dir

    with (
        short_private_dir() as base,
        plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO).serve() as live,
    ):
        yield live


@pytest.mark.slow  # starts the qwen3-tts demo server (make test-all runs it)
def test_qwen3_tts_speaks_mp3_at_a_speed_it_never_sees_and_streams_opus(qwen3_tts):
    """The stages refuse ``speed`` != 1: that mp3 at 1.5 works shows the server did it."""
    speech = qwen3_tts.client().audio.speech
    request = {"model": "tiny", "input": "Hello there", "voice": "serena"}
    extra = {"seed": 3, "max_frames": 6}
    wav = speech.create(**request, response_format="wav", extra_body=extra).content
    samples = len(decode(wav, "wav")[0])
    assert samples > 0 and samples % FRAME == 0
    mp3 = speech.create(**request, response_format="mp3", speed=1.5, extra_body=extra).content
    signal, rate = decode(mp3, "mp3")
    assert rate == SAMPLE_RATE
    assert abs(len(signal) - samples / 1.5) <= tolerance("mp3", rate)
    with speech.with_streaming_response.create(
        **request, response_format="opus", stream_format="audio", extra_body=extra
    ) as response:
        assert response.headers["content-type"] == "audio/ogg"
        opus = b"".join(response.iter_bytes())
    signal, rate = decode(opus, "opus")
    assert rate == 48000
    assert abs(len(signal) - 2 * samples) <= tolerance("opus", rate)
