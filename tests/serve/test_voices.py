"""Voices: upload, list, speak with, survive a restart, delete; aliases; the batch endpoint.

Served for real (runtime, stage processes, HTTP on a free port): MOSS-TTS's
tiny demo clones voices; Qwen3-TTS's tiny demo is a CustomVoice checkpoint,
which has named speakers and cannot clone.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("omni_moss_tts")
pytest.importorskip("omni_qwen3_tts")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")
soundfile = pytest.importorskip("soundfile")

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MOSS = EXAMPLES / "moss_tts_demo.toml"
QWEN = EXAMPLES / "qwen3_tts_demo.toml"


def clip(seconds: float, freq: float = 180.0) -> bytes:
    t = np.arange(int(24000 * seconds)) / 24000
    wave = 0.3 * np.sin(2 * np.pi * freq * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    out = io.BytesIO()
    soundfile.write(out, wave.astype(np.float32), 24000, format="WAV", subtype="PCM_16")
    return out.getvalue()


def serve(deploy: Path, base: str, *flags: str):
    planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=deploy, flags=flags)
    return planned.serve()


def upload(server, name: str, audio: bytes, consent: str = "true", **fields: str):
    return httpx.post(
        f"{server.url}/v1/audio/voices",
        data={"name": name, "consent": consent, **fields},
        files={"file": ("voice.wav", audio, "audio/wav")},
        timeout=120,
    )


def speak(server, voice: str, text: str = "Hello there.", **extra) -> bytes:
    return (
        server.client()
        .audio.speech.create(model="tiny", voice=voice, input=text, extra_body={"seed": 3, **extra})
        .content
    )


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="module")
def moss(voices_dir):
    with short_private_dir() as base:
        flags = ("--server.voices_dir", str(voices_dir), "--preprocessing.factory.max_frames", "20")
        with serve(MOSS, base, *flags) as live:
            yield live


def test_an_uploaded_voice_is_listed_and_speaks_differently(moss) -> None:
    made = upload(moss, "ann", clip(2.0), transcript="A humming tone.")
    assert made.status_code == 201, made.text
    assert made.json()["name"] == "ann" and made.json()["in_context"] is True
    listing = httpx.get(f"{moss.url}/v1/audio/voices").json()
    names = {v["name"]: v["type"] for v in listing["data"]}
    assert names["default"] == "builtin" and names["ann"] == "uploaded"
    assert listing["uploads"] is True
    assert speak(moss, "ann") != speak(moss, "default")
    assert speak(moss, "ann") == speak(moss, "ann")  # the stored prompt, used the same way


@pytest.mark.parametrize(
    ("fields", "audio", "status", "says"),
    [
        ({"consent": "false"}, clip(2.0), 400, "consent"),
        ({}, clip(31.0), 400, "the limit is 30 s"),
        ({}, clip(0.5), 400, "at least 1 s"),
        ({}, b"this is not audio at all", 400, "not readable audio"),
        ({"name": "bad name!"}, clip(2.0), 400, "voice name"),
        ({"transcript": "x" * 4097}, clip(2.0), 400, "4096 (server.max_input_chars)"),
    ],
)
def test_bad_uploads_are_refused_naming_why(moss, fields, audio, status, says) -> None:
    name = fields.pop("name", "bob")
    response = upload(moss, name, audio, **fields)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"]


def test_a_taken_name_is_a_conflict_and_a_voice_can_be_deleted(moss) -> None:
    assert upload(moss, "cat", clip(1.5, 220)).status_code == 201
    again = upload(moss, "cat", clip(1.5, 220))
    assert again.status_code == 409 and "exists" in again.json()["error"]["message"]
    gone = httpx.delete(f"{moss.url}/v1/audio/voices/cat")
    assert gone.status_code == 200 and gone.json() == {"name": "cat", "deleted": True}
    assert httpx.delete(f"{moss.url}/v1/audio/voices/cat").status_code == 404
    with pytest.raises(openai.BadRequestError) as caught:
        speak(moss, "cat")
    assert "unknown voice 'cat'" in caught.value.body["message"]
    assert httpx.delete(f"{moss.url}/v1/audio/voices/default").status_code == 400


@pytest.mark.slow  # a second server start (make test-all runs it)
def test_voices_survive_a_restart_and_a_corrupt_entry_is_skipped(moss, voices_dir) -> None:
    assert upload(moss, "dan", clip(1.5, 150)).status_code == 201
    before = speak(moss, "dan")
    (voices_dir / "broken").mkdir()
    (voices_dir / "broken" / "voice.json").write_text("{not json")
    (voices_dir / ".tmp-leftover").mkdir()  # an interrupted write
    with short_private_dir() as base:
        flags = ("--server.voices_dir", str(voices_dir), "--preprocessing.factory.max_frames", "20")
        with serve(MOSS, base, *flags) as again:
            listing = httpx.get(f"{again.url}/v1/audio/voices").json()
            assert {"ann", "dan"} <= {v["name"] for v in listing["data"]}
            assert [s["name"] for s in listing["skipped"]] == ["broken"]
            assert speak(again, "dan") == before
    assert not (voices_dir / ".tmp-leftover").exists()
    assert json.loads((voices_dir / "dan" / "voice.json").read_text())["consent"] is True


def test_the_batch_endpoint_answers_each_item_in_order(moss) -> None:
    assert upload(moss, "bea", clip(1.5, 300)).status_code == 201
    items = [
        {"input": "One.", "voice": "default", "seed": 1},
        {"input": "Two.", "voice": "nobody"},
        {"input": "Three.", "voice": "bea", "response_format": "flac", "seed": 2},
        {"input": "Four.", "sample_rate": 16000},
        {"input": "Five.", "speed": 9},
    ]
    reply = httpx.post(f"{moss.url}/v1/audio/speech/batch", json={"items": items}, timeout=120)
    assert reply.status_code == 200, reply.text
    data = reply.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2, 3, 4]
    assert [d["status"] for d in data] == [200, 400, 200, 200, 400]
    assert data[4]["error"]["param"] == "speed"
    four, rate16 = soundfile.read(io.BytesIO(base64.b64decode(data[3]["audio"])))
    assert rate16 == 16000 and four.size > 0
    assert "unknown voice 'nobody'" in data[1]["error"]["message"]
    one, rate = soundfile.read(io.BytesIO(base64.b64decode(data[0]["audio"])))
    assert rate == 24000 and one.size > 0
    # The vocoder decodes the batch's items together, and a batched matmul may
    # round differently from a lone one: the same seed gives the same codes,
    # so the speech must match a lone request's to within a couple of LSBs.
    alone, _ = soundfile.read(io.BytesIO(speak(moss, "default", "One.", seed=1)), dtype="int16")
    batched, _ = soundfile.read(io.BytesIO(base64.b64decode(data[0]["audio"])), dtype="int16")
    assert batched.shape == alone.shape
    assert np.abs(batched.astype(np.int32) - alone.astype(np.int32)).max() <= 2
    three, _ = soundfile.read(io.BytesIO(base64.b64decode(data[2]["audio"])))
    assert three.size > 0 and data[2]["response_format"] == "flac"
    empty = httpx.post(f"{moss.url}/v1/audio/speech/batch", json={"items": []}, timeout=30)
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "items"


@pytest.mark.slow  # starts the qwen3-tts demo server (make test-all runs it)
def test_a_model_that_cannot_clone_refuses_uploads_and_aliases_serve_openai_names() -> None:
    with short_private_dir() as base:
        flags = ("--server.voice_aliases", '{alloy = "serena"}')
        with (
            short_private_dir() as store,
            serve(QWEN, base, *flags, "--server.voices_dir", str(store)) as server,
        ):
            refused = upload(server, "eve", clip(2.0))
            assert refused.status_code == 400
            assert "cannot clone voices" in refused.json()["error"]["message"]
            # an unmodified OpenAI client's voice name, mapped by the server
            assert speak(server, "alloy") == speak(server, "serena")
            with pytest.raises(openai.BadRequestError) as caught:
                speak(server, "nova")
            message = caught.value.body["message"]
            assert "unknown voice 'nova'" in message and "serena" in message
            listing = httpx.get(f"{server.url}/v1/audio/voices").json()
            assert listing["aliases"] == {"alloy": "serena"}
            assert {v["name"] for v in listing["data"]} == {"eric", "ryan", "serena"}


def test_an_uploaded_voice_speaks_over_the_websocket_as_over_http(moss) -> None:
    import asyncio

    from websockets.asyncio.client import connect

    assert upload(moss, "gus", clip(1.5, 260)).status_code == 201
    text = "Hello there."

    async def session() -> bytes:
        url = moss.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        pcm = bytearray()
        async with connect(url) as ws:
            config = {"type": "session.config", "voice": "gus", "seed": 3, "response_format": "pcm"}
            await ws.send(json.dumps(config))
            await ws.send(json.dumps({"type": "input.text", "text": text}))
            await ws.send(json.dumps({"type": "input.done"}))
            async for message in ws:
                if isinstance(message, bytes):
                    pcm += message
                elif json.loads(message)["type"] in ("session.done", "error"):
                    assert json.loads(message)["type"] == "session.done", message
                    break
        return bytes(pcm)

    over_ws = asyncio.run(session())
    over_http = speak(moss, "gus", text, response_format="pcm")
    assert over_ws and over_ws == over_http
