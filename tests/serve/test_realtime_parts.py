"""The realtime session's parts on their own: audio formats, settings, turn detection, history."""

from __future__ import annotations

import base64
import shutil
import subprocess
import warnings

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("webrtcvad")

from omni_core.serve.realtime import formats  # noqa: E402
from omni_core.serve.realtime.config import (  # noqa: E402
    ConfigError,
    SessionConfig,
    TurnDetection,
    apply_update,
)
from omni_core.serve.realtime.conversation import MAX_ITEMS, Conversation, Item  # noqa: E402
from omni_core.serve.realtime.items import truncate  # noqa: E402
from omni_core.serve.realtime.vad import ServerVad, aggressiveness  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")  # CPython's own G.711, the reference

ALL = np.arange(-32768, 32768, dtype=np.int64).astype(np.int16)


def test_g711_equals_cpythons_reference_for_every_sample_and_code() -> None:
    raw = ALL.tobytes()
    assert formats._ulaw_encode(ALL).tobytes() == audioop.lin2ulaw(raw, 2)
    assert formats._alaw_encode(ALL).tobytes() == audioop.lin2alaw(raw, 2)
    codes = np.arange(256, dtype=np.uint8)
    assert formats._ulaw_decode(codes).tobytes() == audioop.ulaw2lin(codes.tobytes(), 2)
    assert formats._alaw_decode(codes).tobytes() == audioop.alaw2lin(codes.tobytes(), 2)


def test_formats_are_read_in_ga_and_beta_spelling_and_converted_at_the_edges() -> None:
    assert formats.parse_format({"type": "audio/pcm", "rate": 24000}) == formats.PCM24
    assert formats.parse_format("pcm16") == formats.PCM24
    ulaw = formats.parse_format("g711_ulaw")
    assert ulaw == formats.parse_format({"type": "audio/pcmu"}) and ulaw.rate == 8000
    with pytest.raises(ValueError, match="audio/pcm is 24000 Hz here, not 16000"):
        formats.parse_format({"type": "audio/pcm", "rate": 16000})
    with pytest.raises(ValueError, match="not supported"):
        formats.parse_format("opus")
    tone = (np.sin(np.arange(2400) / 5) * 8000).astype("<i2").tobytes()  # 100 ms at 24 kHz
    down = formats.from_session_pcm(tone, ulaw)
    assert len(down) == 800  # 100 ms at 8 kHz, one byte a sample
    back = np.frombuffer(formats.to_session_pcm(down, ulaw), dtype="<i2")
    assert back.size == 2400
    assert np.corrcoef(back.astype(float), np.frombuffer(tone, "<i2").astype(float))[0, 1] > 0.95


def test_session_update_reads_ga_and_beta_and_refuses_by_name() -> None:
    base = SessionConfig()
    ga = apply_update(
        base,
        {
            "type": "realtime",
            "instructions": "be brief",
            "output_modalities": ["text"],
            "max_output_tokens": 20,
            "audio": {
                "input": {
                    "format": {"type": "audio/pcma"},
                    "turn_detection": None,
                    "transcription": {"model": "x"},
                },
                "output": {"voice": "ethan"},
            },
        },
        audio_out=True,
    )
    assert (ga.instructions, ga.output_modalities, ga.max_output_tokens) == (
        "be brief",
        ("text",),
        20,
    )
    assert ga.input_format.type == "audio/pcma" and ga.turn_detection is None
    assert ga.transcription and ga.voice == "ethan"
    beta = apply_update(
        base,
        {
            "modalities": ["audio", "text"],
            "input_audio_format": "g711_ulaw",
            "turn_detection": {"type": "server_vad", "threshold": 0.9, "silence_duration_ms": 200},
            "max_response_output_tokens": "inf",
        },
        audio_out=True,
    )
    assert beta.output_modalities == ("audio",) and beta.input_format.type == "audio/pcmu"
    assert beta.turn_detection == TurnDetection(threshold=0.9, silence_duration_ms=200)
    described = beta.describe("tiny", "sess_1")
    assert described["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 200
    for update, param in (
        ({"bogus": 1}, "session.bogus"),
        ({"output_modalities": ["video"]}, "session.output_modalities"),
        (
            {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
            "session.audio.input.turn_detection",
        ),
        ({"max_output_tokens": 0}, "session.max_output_tokens"),
        ({"temperature": 2.5}, "session.temperature"),
        ({"temperature": "hot"}, "session.temperature"),
        ({"temperature": True}, "session.temperature"),
    ):
        with pytest.raises(ConfigError) as refused:
            apply_update(base, update, audio_out=True)
        assert refused.value.param == param
    with pytest.raises(ConfigError, match="produces no audio"):
        apply_update(base, {"output_modalities": ["audio"]}, audio_out=False)


def test_the_beta_temperature_is_kept_described_and_cleared() -> None:
    """Beta clients send ``temperature``; it was once dropped in silence, so a client asking
    for a steadier voice got the pipeline's default sampling without being told."""
    assert "temperature" not in SessionConfig().describe("tiny", "sess_1")
    greedy = apply_update(SessionConfig(), {"temperature": 0}, audio_out=True)
    assert greedy.temperature == 0.0
    assert greedy.describe("tiny", "sess_1")["temperature"] == 0.0
    warm = apply_update(greedy, {"temperature": 1.2}, audio_out=True)
    assert warm.temperature == 1.2
    assert apply_update(warm, {"temperature": None}, audio_out=True).temperature is None


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng (apt)")
def test_server_vad_finds_espeak_speech_between_silences(tmp_path) -> None:
    sf = pytest.importorskip("soundfile")
    path = tmp_path / "hello.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "Hello there, how are you today?"], check=True)
    samples, rate = sf.read(path, dtype="int16")
    speech = formats.resample(samples, rate, 24000).astype("<i2").tobytes()
    silence = bytes(24000 * 2)  # one second
    audio = silence + speech + silence * 2
    vad = ServerVad(TurnDetection(prefix_padding_ms=300, silence_duration_ms=500))
    found = []
    for i in range(0, len(audio), 4800):  # 100 ms appends
        found += vad.feed(audio[i : i + 4800])
    assert [e.kind for e in found] == ["started", "stopped"]
    speech_ms = len(speech) / 48
    assert 500 <= found[0].ms <= 1000  # speech at 1000 ms, 300 ms of padding before it
    assert 1000 + speech_ms * 0.7 <= found[1].ms <= 1000 + speech_ms + 100
    quiet = ServerVad(TurnDetection())
    assert quiet.feed(silence * 3) == []
    assert [aggressiveness(t) for t in (0.0, 0.3, 0.5, 0.9, 1.0)] == [0, 1, 2, 3, 3]


def test_the_history_is_bounded_and_speaks_audio_as_audio() -> None:
    conversation = Conversation()
    for i in range(MAX_ITEMS + 5):
        conversation.add(Item(f"i{i}", "user", [{"type": "input_text", "text": f"t{i}"}]))
    assert len(conversation.items) == MAX_ITEMS and conversation.items[0].id == "i5"
    conversation.add(Item("a", "user", [{"type": "input_audio", "pcm": bytes(4800)}]))
    messages = conversation.messages("be kind")
    assert messages[0] == {"role": "system", "content": "be kind"}
    part = messages[-1]["content"][0]
    wav = base64.b64decode(part["input_audio"]["data"])
    assert part["type"] == "input_audio" and wav[:4] == b"RIFF" and len(wav) == 44 + 4800


def test_truncate_keeps_what_the_client_heard() -> None:
    item = Item(
        "a", "assistant", [{"type": "output_audio", "transcript": "0123456789"}], audio_ms=1000.0
    )
    assert truncate(item, 400) == 400
    assert item.parts[0]["transcript"] == "0123" and item.audio_ms == 400


def test_user_items_carry_images_and_videos_as_data_urls_to_the_chat_messages() -> None:
    from omni_core.serve.common.errors import APIError
    from omni_core.serve.realtime.config import SessionConfig
    from omni_core.serve.realtime.items import parse_item

    video = "data:video/mp4;base64," + base64.b64encode(b"\x00\x00\x00\x18ftypmp42").decode()
    image = "data:image/png;base64,iVBORw0KGgo="
    item = parse_item(
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_video", "video_url": video},
                {"type": "input_image", "image_url": image},
                {"type": "input_text", "text": "what happens?"},
            ],
        },
        SessionConfig(),
    )
    conversation = Conversation()
    conversation.add(item)
    (message,) = conversation.messages("")
    assert message["content"] == [
        {"type": "video_url", "video_url": {"url": video}},
        {"type": "image_url", "image_url": {"url": image}},
        {"type": "text", "text": "what happens?"},
    ]
    bad = [
        ({"type": "input_video", "video_url": "/etc/passwd"}, "must be a data: URL"),
        ({"type": "input_video", "video_url": "data:image/png;base64,AAAA"}, "data:video/"),
        ({"type": "input_video", "video_url": "data:video/mp4;base64,A A"}, "not base64"),
        ({"type": "input_image", "image_url": None}, "must be a data: URL"),
    ]
    for part, words in bad:
        with pytest.raises(APIError, match=words) as caught:
            parse_item({"type": "message", "role": "user", "content": [part]}, SessionConfig())
        assert caught.value.param.startswith("item.content[0].")
    with pytest.raises(APIError, match="input_text, text, input_audio, input_image"):
        parse_item(
            {"type": "message", "role": "user", "content": [{"type": "input_file"}]},
            SessionConfig(),
        )
    with pytest.raises(APIError, match="not a part a system item"):
        parse_item(
            {"type": "message", "role": "system", "content": [{"type": "input_video"}]},
            SessionConfig(),
        )


@pytest.fixture
def without_webrtcvad(monkeypatch):
    """This server as if installed without the audio extra's voice detector."""
    from omni_core.serve.realtime import vad

    monkeypatch.setitem(__import__("sys").modules, "webrtcvad", None)  # import raises
    vad.missing.cache_clear()
    yield
    vad.missing.cache_clear()


def test_without_the_voice_detector_sessions_start_with_commits_and_server_vad_is_refused(
    without_webrtcvad, caplog
) -> None:
    with caplog.at_level("WARNING", logger="omni_core.serve.realtime.vad"):
        for answers in (True, False):  # a chat pipeline, and a transcription-only one
            config = SessionConfig.initial(audio_out=True, answers=answers)
            assert config.turn_detection is None
            assert config.describe("m", "s")["audio"]["input"]["turn_detection"] is None
    assert "pip install 'omni-core[audio]'" in caplog.text
    config = SessionConfig.initial(audio_out=True, answers=True)
    update = {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    with pytest.raises(ConfigError) as refused:
        apply_update(config, update, audio_out=True)
    assert refused.value.param == "session.audio.input.turn_detection"
    assert "webrtcvad-wheels" in str(refused.value) and "input_audio_buffer.commit" in str(
        refused.value
    )
    # turning it off, or leaving it alone, still works
    off = {"audio": {"input": {"turn_detection": None}}}
    assert apply_update(config, off, audio_out=True).turn_detection is None
    assert apply_update(config, {"instructions": "hi"}, audio_out=True).instructions == "hi"


def test_with_the_voice_detector_sessions_start_with_server_vad() -> None:
    from omni_core.serve.realtime import vad

    vad.missing.cache_clear()
    assert SessionConfig.initial(audio_out=True, answers=True).turn_detection == TurnDetection()
    quiet = SessionConfig.initial(audio_out=True, answers=False).turn_detection
    assert quiet is not None and not quiet.create_response
