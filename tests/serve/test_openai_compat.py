"""Moving over from OpenAI: the preset (``server.openai_compat``), model-name aliases
(``server.served_model_name`` as a list), and errors that name the settings to change.

Through a real server with the official ``openai`` SDK: the test pipeline
``t-speech`` (fast), and Qwen3-TTS's tiny demo, CustomVoice and Base (slow).
"""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx2")

from live_servers import running_server  # noqa: E402

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

QWEN = Path(__file__).resolve().parents[2] / "examples" / "qwen3_tts_demo.toml"


def is_mp3(data: bytes) -> bool:
    """An ID3 tag or an MPEG audio frame sync (11 bits set: 0xFFE0 and up, e.g. 0xFFFB)."""
    return data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0)


@pytest.fixture(scope="module")
def preset_server(tmp_path_factory: pytest.TempPathFactory):
    flags = [
        "--server.openai_compat",
        "true",
        "--server.served_model_name",
        '["mine", "my-alias"]',
    ]
    yield from running_server("t-speech", flags, tmp_path_factory.mktemp("openai"))


def test_the_preset_speaks_mp3_to_openai_model_names(preset_server) -> None:
    client = preset_server.client()
    for model in ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "mine", "my-alias"):
        spoken = client.audio.speech.create(model=model, voice="alice", input="Hi there")
        assert is_mp3(spoken.content), (model, spoken.content[:4])
        assert spoken.response.headers["content-type"] == "audio/mpeg"
    # a format the client names still wins over the preset's default
    wav = client.audio.speech.create(
        model="tts-1", voice="alice", input="Hi", response_format="wav"
    )
    assert wav.content[:4] == b"RIFF"
    # the batch endpoint's items follow the same default
    batch = httpx.post(
        f"{preset_server.url}/v1/audio/speech/batch",
        json={"model": "tts-1", "items": [{"input": "Hi", "voice": "alice"}]},
        timeout=60,
    ).json()
    assert batch["data"][0]["response_format"] == "mp3"
    assert is_mp3(base64.b64decode(batch["data"][0]["audio"]))


def test_the_preset_accepts_openai_chat_names_and_lists_the_first_served_name(
    preset_server,
) -> None:
    client = preset_server.client()
    chat = client.chat.completions.create(
        model="gpt-4o-audio-preview", messages=[{"role": "user", "content": "Hi"}]
    )
    assert chat.choices[0].message is not None
    assert [m.id for m in client.models.list()] == ["mine"]
    with pytest.raises(openai.NotFoundError) as caught:  # transcription is not served here
        client.audio.speech.create(model="whisper-1", voice="alice", input="Hi")
    message = caught.value.body["message"]
    assert "'mine', 'my-alias'" in message and "'tts-1'" in message


def test_without_the_preset_wav_is_the_default_and_an_openai_name_is_a_404_naming_the_setting(
    speech_server,
) -> None:
    client = speech_server.client()
    spoken = client.audio.speech.create(model="t-speech", voice="alice", input="Hi")
    assert spoken.content[:4] == b"RIFF"
    with pytest.raises(openai.NotFoundError) as caught:
        client.audio.speech.create(model="tts-1", voice="alice", input="Hi")
    message = caught.value.body["message"]
    assert "model 'tts-1' is not served here" in message
    assert "this server serves 't-speech'" in message
    assert "server.served_model_name" in message and "server.openai_compat" in message


# -- Qwen3-TTS: OpenAI's voices on a model's own voices; cloning with voice "default" --


def reference_wav(seconds: float = 1.5, hz: float = 180.0, rate: int = 24000) -> str:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(0).standard_normal(t.shape[0])
    wave = (0.3 * np.sin(2 * np.pi * hz * t) + 0.05 * noise).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, wave, rate, format="WAV", subtype="PCM_16")
    return base64.b64encode(out.getvalue()).decode()


def serve_qwen(base: str, *flags: str):
    planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=QWEN, flags=flags)
    return planned.serve()


def wav(client, voice: str, model: str = "tiny", **extra) -> bytes:
    return client.audio.speech.create(
        model=model,
        voice=voice,
        input="Hello there.",
        response_format="wav",
        extra_body={"seed": 3, "max_frames": 8, **extra},
    ).content


@pytest.mark.slow  # starts the qwen3-tts demo server (make test-all runs it)
def test_openai_voices_map_onto_the_models_voices_in_order_and_explicit_aliases_win() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("omni_qwen3_tts")
    flags = ("--server.openai_compat", "true", "--server.voice_aliases", '{alloy = "serena"}')
    with short_private_dir() as base, serve_qwen(base, *flags) as server:
        client = server.client()
        spoken = client.audio.speech.create(model="tts-1", voice="alloy", input="Hi")
        assert is_mp3(spoken.content)
        spoken = client.audio.speech.create(model="gpt-4o-mini-tts", voice="nova", input="Hi")
        assert is_mp3(spoken.content)
        aliases = httpx.get(f"{server.url}/v1/audio/voices").json()["aliases"]
        # eric, ryan, serena in order, wrapping around; the operator's alloy wins
        assert aliases["alloy"] == "serena" and aliases["ash"] == "ryan"
        assert aliases["ballad"] == "serena" and aliases["coral"] == "eric"
        assert len(aliases) == 11
        assert wav(client, "alloy") == wav(client, "serena")
        assert wav(client, "ash") == wav(client, "ryan")
        with pytest.raises(openai.NotFoundError):  # a speech-only pipeline: no chat names
            client.audio.speech.create(model="gpt-4o-audio-preview", voice="alloy", input="Hi")


@pytest.mark.slow  # starts the qwen3-tts demo server on a Base checkpoint
def test_a_base_checkpoint_clones_through_the_openai_client_with_voice_default(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("soundfile")
    weights = pytest.importorskip("omni_qwen3_tts.weights")
    root = tmp_path / "base"
    shutil.copytree(weights.PRESETS_DIR / "tiny", root)
    config = json.loads((root / "config.json").read_text())
    config["tts_model_type"] = "base"
    (root / "config.json").write_text(json.dumps(config))
    ref = {"ref_audio": reference_wav(), "ref_text": "A humming tone."}
    with short_private_dir() as base, serve_qwen(base, "--model_path", str(root)) as server:
        client = server.client()
        cloned = wav(client, "default", model="base", **ref)
        assert cloned[:4] == b"RIFF" and len(cloned) > 44
        with pytest.raises(openai.BadRequestError) as caught:  # "default" needs the clip
            wav(client, "default", model="base")
        assert "ref_audio" in caught.value.body["message"]
        with pytest.raises(openai.BadRequestError) as caught:
            wav(client, "alloy", model="base", **ref)
        message = caught.value.body["message"]
        assert "unknown voice 'alloy'; voices: none" in message
        assert "'default' with ref_audio" in message
        assert "server.voice_aliases" in message and "server.openai_compat" in message
    flags = ("--model_path", str(root), "--server.openai_compat", "true")
    with short_private_dir() as base, serve_qwen(base, *flags) as server:
        # the preset maps OpenAI's voices to "default": the request's ref_audio is the voice
        assert wav(server.client(), "alloy", model="tts-1", **ref)[:4] == b"RIFF"
