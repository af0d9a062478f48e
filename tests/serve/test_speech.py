"""``POST /v1/audio/speech`` through the official openai client against a live server."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
import soundfile
from omni_test_speech import CHUNK_SAMPLES, SAMPLE_RATE, VOICES
from serve_helpers import parse_wav, samples

TEXT = "the quick brown fox"  # four words: four 50 ms chunks
FRAMES = 4 * CHUNK_SAMPLES


def dominant_frequency(signal: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(signal))
    return float(np.fft.rfftfreq(len(signal), 1 / SAMPLE_RATE)[spectrum.argmax()])


def test_wav_has_a_valid_header_and_the_voice_s_sine(speech_server):
    client = speech_server.client()
    for voice, frequency in VOICES.items():
        audio = client.audio.speech.create(
            model="t-speech", input=TEXT, voice=voice, response_format="wav"
        ).content
        header, pcm = parse_wav(audio)
        assert header == {
            "riff_size": 36 + len(pcm),
            "fmt_size": 16,
            "format": 1,
            "channels": 1,
            "rate": SAMPLE_RATE,
            "byte_rate": 2 * SAMPLE_RATE,
            "block": 2,
            "bits": 16,
            "data_size": len(pcm),
        }
        signal = samples(pcm)
        assert len(signal) == FRAMES
        assert np.isfinite(signal).all()
        assert 0.45 < np.abs(signal).max() < 0.55  # the stage's sine has amplitude 0.5
        assert abs(dominant_frequency(signal) - frequency) < 10


def test_streamed_wav_arrives_as_the_stages_emit_it(speech_server):
    client = speech_server.client()
    with client.audio.speech.with_streaming_response.create(
        model="t-speech",
        input=TEXT,
        voice="bob",
        response_format="wav",
        extra_body={"stream": True},
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        assert "content-length" not in response.headers  # chunked: really streamed
        data = b"".join(response.iter_bytes())
    header, pcm = parse_wav(data)
    assert header["data_size"] == 0xFFFFFFFF and header["rate"] == SAMPLE_RATE
    assert len(samples(pcm)) == FRAMES
    assert abs(dominant_frequency(samples(pcm)) - VOICES["bob"]) < 10


def test_pcm_is_the_raw_int16_of_the_wav(speech_server):
    client = speech_server.client()
    pcm = client.audio.speech.create(
        model="t-speech", input=TEXT, voice="alice", response_format="pcm"
    ).content
    _, wav_pcm = parse_wav(
        client.audio.speech.create(model="t-speech", input=TEXT, voice="alice").content
    )
    assert pcm == wav_pcm and len(pcm) == 2 * FRAMES


def test_flac_decodes_to_the_same_samples(speech_server):
    client = speech_server.client()
    flac = client.audio.speech.create(
        model="t-speech", input=TEXT, voice="alice", response_format="flac"
    ).content
    assert flac[:4] == b"fLaC"
    decoded, rate = soundfile.read(io.BytesIO(flac), dtype="int16")
    assert rate == SAMPLE_RATE
    pcm = client.audio.speech.create(
        model="t-speech", input=TEXT, voice="alice", response_format="pcm"
    ).content
    assert decoded.tobytes() == pcm  # lossless


def test_an_unknown_voice_is_the_client_s_error_with_the_stage_s_message(speech_server):
    client = speech_server.client()
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            client.audio.speech.create(
                model="t-speech", input=TEXT, voice="zed", extra_body={"stream": stream}
            )
        assert caught.value.status_code == 400
        assert "unknown voice 'zed'; voices: alice, bob" in caught.value.message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"voice": "alice"}, "field 'input': Field required"),
        ({"input": "", "voice": "alice"}, "field 'input'"),
        ({"input": "hi", "response_format": "ogg"}, "'mp3', 'opus' or 'aac', got 'ogg'"),
        ({"input": "hi", "speed": 9}, "field 'speed'"),
    ],
)
def test_malformed_requests_get_400_with_a_message(speech_server, body, message):
    client = speech_server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.post("/audio/speech", body={"model": "t-speech", **body}, cast_to=bytes)
    assert message in caught.value.message


def test_a_body_over_the_limit_gets_413(speech_server):
    client = speech_server.client()
    with pytest.raises(openai.APIStatusError) as caught:
        client.audio.speech.create(model="t-speech", input="word " * 2000, voice="alice")
    assert caught.value.status_code == 413
    assert "server.max_body_bytes" in caught.value.message


def test_an_unknown_model_gets_404(speech_server):
    with pytest.raises(openai.NotFoundError, match="model 'tts-1' is not served here"):
        speech_server.client().audio.speech.create(model="tts-1", input=TEXT, voice="alice")


def test_a_chat_only_pipeline_has_no_speech_endpoint(chat_server):
    with pytest.raises(
        openai.NotFoundError, match="does not serve /v1/audio/speech; it serves: chat"
    ):
        chat_server.client().audio.speech.create(model="t-chat", input=TEXT, voice="alice")
