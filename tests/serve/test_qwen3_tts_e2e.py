"""Qwen3-TTS end to end: the official ``openai`` client against a real ``omni serve`` subprocess.

The server is the README's main command on the built-in default,
``omni serve examples/qwen3_tts_demo.toml`` (the tiny preset's real
architecture with dummy weights on the CPU), started once for the module on a
port the OS picks. It is always stopped: SIGTERM at the end of the module
(whatever the tests did), SIGKILL for the tree if that does not work, and the
kernel's parent-death signal if pytest itself dies.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from serve_helpers import OmniServe, alive, samples
from serve_helpers import parse_wav as wav_fields

pytest.importorskip("omni_qwen3_tts")

DEMO = Path(__file__).resolve().parents[2] / "examples" / "qwen3_tts_demo.toml"
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
MODEL = "tiny"  # the demo's model_path names the served model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServe]:
    served = OmniServe(tmp_path_factory.mktemp("qwen3-tts-serve"), DEMO)
    try:
        yield served
    finally:
        children = set(served.children)
        status = served.stop()
        assert status == 0, served.stderr()
        assert not any(alive(p) for p in children), "omni serve left a child running"
        assert not list((served.base / "run").glob("qwen3-tts-*")), "runtime directory left"
        assert "Traceback" not in served.stderr()


def parse_wav(data: bytes) -> tuple[dict[str, int], np.ndarray]:
    """The header fields of a canonical 16-bit PCM WAV, and its samples as float32."""
    header, pcm = wav_fields(data)
    assert len(pcm) % 2 == 0
    return header, samples(pcm)


def check_signal(samples: np.ndarray, max_frames: int | None = None) -> None:
    """Speech-codec audio: whole frames, non-empty, finite, not silence."""
    assert samples.shape[0] > 0 and samples.shape[0] % SAMPLES_PER_FRAME == 0
    if max_frames is not None:
        assert samples.shape[0] <= max_frames * SAMPLES_PER_FRAME
    assert np.isfinite(samples).all()
    assert float(samples.std()) > 1e-4


def speech(client: openai.OpenAI, **extra: Any) -> bytes:
    voice = extra.pop("voice", "serena")
    text = extra.pop("input", "Hello the world")
    return client.audio.speech.create(
        model=MODEL, input=text, voice=voice, response_format="wav", extra_body=extra
    ).content


def test_speech_create_returns_a_wav(server):
    header, samples = parse_wav(speech(server.client(), seed=1, max_frames=24))
    assert header == {
        "riff_size": 36 + 2 * samples.shape[0],
        "fmt_size": 16,
        "format": 1,
        "channels": 1,
        "rate": SAMPLE_RATE,
        "byte_rate": 2 * SAMPLE_RATE,
        "block": 2,
        "bits": 16,
        "data_size": 2 * samples.shape[0],
    }
    check_signal(samples, max_frames=24)


def test_a_capped_request_says_length_in_its_finish_header(server):
    # Seeded: the tiny model may draw its end-of-speech code at any step (no
    # min_new_tokens), which would end the speech by itself before the cap.
    response = server.client().audio.speech.with_raw_response.create(
        model=MODEL, input="Hello there", voice="serena", extra_body={"max_frames": 3, "seed": 1}
    )
    assert response.headers["x-omni-finish-reason"] == "length"
    _, samples = parse_wav(response.content)
    assert samples.shape[0] == 3 * 1920


def test_a_capped_sse_stream_ends_with_the_usage_and_length(server):
    """The done event counts the codec frames made and says the cap ended the speech."""
    body = {
        "model": MODEL,
        "input": "Hello there",
        "voice": "serena",
        "stream_format": "sse",
        "max_frames": 3,
        "seed": 1,  # as above: no end-of-speech code drawn before the cap
    }
    stream = server.client().post(
        "/audio/speech", body=body, cast_to=object, stream=True, stream_cls=openai.Stream[object]
    )
    done = list(stream)[-1]
    assert done["type"] == "speech.audio.done"
    assert done["finish_reason"] == "length"
    usage = done["usage"]
    assert usage["output_tokens"] == 3
    assert usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + 3


def test_the_readme_request_with_the_defaults(server):
    """What the README's curl line sends: text and voice only (the demo caps frames at 200)."""
    audio = server.client().audio.speech.create(model=MODEL, input="Hello", voice="serena")
    _, samples = parse_wav(audio.content)
    check_signal(samples, max_frames=200)


def test_streamed_wav_equals_the_whole_one(server):
    client = server.client()
    body = {"input": "Hello the world, the user is here", "seed": 5, "max_frames": 30}
    with client.audio.speech.with_streaming_response.create(
        model=MODEL,
        input=body["input"],
        voice="ryan",
        response_format="wav",
        extra_body={"stream": True, "seed": 5, "max_frames": 30},
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        assert "content-length" not in response.headers  # chunked: really streamed
        parts = list(response.iter_bytes())
    streamed = b"".join(parts)
    header, samples = parse_wav(streamed)
    assert header["data_size"] == 0xFFFFFFFF and header["rate"] == SAMPLE_RATE
    assert header["channels"] == 1
    check_signal(samples, max_frames=30)
    whole = speech(client, voice="ryan", **body)
    assert parse_wav(whole)[1].tobytes() == samples.tobytes()  # same seed, same audio


def test_sixteen_concurrent_requests_all_complete(server):
    client = server.client()

    def one(i: int) -> bytes:
        return speech(client, input=f"request number {i}", seed=i, max_frames=8 + i % 5)

    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert time.monotonic() - started < 60
    for i, data in enumerate(results):
        header, samples = parse_wav(data)
        assert header["rate"] == SAMPLE_RATE and header["channels"] == 1
        check_signal(samples, max_frames=8 + i % 5)
    assert len({data for data in results}) == 16  # different seeds and texts: different audio


@pytest.mark.parametrize("stream", [False, True])
def test_an_invalid_voice_is_a_400_naming_it(server, stream):
    with pytest.raises(openai.BadRequestError) as caught:
        speech(server.client(), voice="zed", stream=stream)
    assert caught.value.status_code == 400
    assert "unknown voice 'zed'" in caught.value.message
    assert "serena" in caught.value.message  # and says which voices exist
