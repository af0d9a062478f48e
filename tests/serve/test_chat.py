"""``POST /v1/chat/completions``: text, audio, SSE streaming and local media, via openai."""

from __future__ import annotations

import base64
import io
import os
import wave

import numpy as np
import openai
import pytest
from omni_test_speech import CHUNK_SAMPLES, SAMPLE_RATE

PROMPT = "hello there"
REPLY = "You said: hello there"  # four words: four audio chunks
FRAMES = 4 * CHUNK_SAMPLES


def user(content) -> list[dict]:
    return [{"role": "user", "content": content}]


def test_text_completion(chat_server):
    completion = chat_server.client().chat.completions.create(model="t-chat", messages=user(PROMPT))
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == REPLY
    assert choice.message.audio is None
    assert choice.finish_reason == "stop"
    assert completion.object == "chat.completion" and completion.model == "t-chat"


def test_a_token_cap_ends_the_answer_as_length(chat_server):
    client = chat_server.client()
    completion = client.chat.completions.create(model="t-chat", messages=user(PROMPT), max_tokens=2)
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == " ".join(REPLY.split(" ")[:2])
    chunks = list(
        client.chat.completions.create(
            model="t-chat", messages=user(PROMPT), max_tokens=2, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_token_cap_ends_the_answer_as_length_when_audio_is_asked_for_too(chat_server):
    """The talker's own "stop" (it spoke all the text it got) never hides the text's cap."""
    client = chat_server.client()
    asked = {
        "model": "t-chat",
        "messages": user(PROMPT),
        "max_tokens": 2,
        "modalities": ["text", "audio"],
        "audio": {"voice": "bob", "format": "wav"},
    }
    completion = client.chat.completions.create(**asked)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 2
    assert completion.choices[0].message.audio.data
    streamed = {**asked, "audio": {"voice": "bob", "format": "pcm16"}, "stream": True}
    chunks = list(client.chat.completions.create(**streamed))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # uncapped, both stages end as "stop"
    whole = client.chat.completions.create(**{**asked, "max_tokens": None})
    assert whole.choices[0].finish_reason == "stop"


def test_text_and_audio_completion(chat_server):
    completion = chat_server.client().chat.completions.create(
        model="t-chat",
        messages=user(PROMPT),
        modalities=["text", "audio"],
        audio={"voice": "bob", "format": "wav"},
    )
    message = completion.choices[0].message
    assert message.content == REPLY
    assert message.audio.transcript == REPLY and message.audio.id
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        assert wav.getnframes() == FRAMES


def test_streaming_text_deltas(chat_server):
    stream = chat_server.client().chat.completions.create(
        model="t-chat", messages=user(PROMPT), stream=True
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert len(deltas) == 4 and "".join(deltas) == REPLY
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_streaming_text_and_audio_deltas(chat_server):
    stream = chat_server.client().chat.completions.create(
        model="t-chat",
        messages=user(PROMPT),
        modalities=["text", "audio"],
        audio={"voice": "alice", "format": "pcm16"},
        stream=True,
    )
    text, audio, expires = [], [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
        if delta.audio is not None and delta.audio.data:
            assert delta.audio.id
            audio.append(base64.b64decode(delta.audio.data))
            expires = None
        elif delta.audio is not None:
            expires = delta.audio.expires_at
    assert "".join(text) == REPLY
    assert len(audio) == 4
    assert expires  # the last audio update carries only its expiry
    signal = np.frombuffer(b"".join(audio), dtype="<i2")
    assert len(signal) == FRAMES and np.abs(signal).max() > 10000


def test_streamed_audio_must_be_pcm16(chat_server):
    with pytest.raises(openai.BadRequestError, match="streamed audio is pcm16"):
        chat_server.client().chat.completions.create(
            model="t-chat",
            messages=user(PROMPT),
            modalities=["text", "audio"],
            audio={"voice": "alice", "format": "wav"},
            stream=True,
        )


def test_a_stage_s_request_error_is_a_400_streaming_or_not(chat_server):
    client = chat_server.client()
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="the last user message has no text"):
            client.chat.completions.create(model="t-chat", messages=user("  "), stream=stream)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "field 'messages': Field required"),
        ({"messages": []}, "field 'messages'"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "field 'messages.0.role'"),
        ({"messages": user("x"), "n": 2}, "field 'n'"),
        ({"messages": user("x"), "temperature": 7}, "field 'temperature'"),
    ],
)
def test_malformed_chat_requests_get_400(chat_server, body, message):
    with pytest.raises(openai.BadRequestError) as caught:
        chat_server.client().post(
            "/chat/completions", body={"model": "t-chat", **body}, cast_to=object
        )
    assert message in caught.value.message


def test_a_speech_pipeline_answers_chat_with_audio(speech_server):
    completion = speech_server.client().chat.completions.create(
        model="t-speech",
        messages=user("one two three"),
        modalities=["text", "audio"],
        audio={"voice": "alice", "format": "pcm16"},
    )
    message = completion.choices[0].message
    assert message.content is None  # the pipeline declares no text stage
    assert len(base64.b64decode(message.audio.data)) == 2 * 3 * CHUNK_SAMPLES


def test_local_media_only_from_the_allowed_directories(speech_server, media_dir, tmp_path):
    client = speech_server.client()
    allowed = str(media_dir / "clip.wav")
    outside = tmp_path / "secret.wav"
    outside.write_bytes(b"RIFF")
    sneaky = media_dir / "link.wav"
    if not sneaky.exists():
        os.symlink(outside, sneaky)

    def ask(reference: str, kind: str = "audio_url"):
        part = (
            {"type": kind, kind: {"url": reference}}
            if kind.endswith("_url")
            else {"type": kind, kind: reference}
        )
        return client.chat.completions.create(
            model="t-speech",
            modalities=["text", "audio"],
            audio={"voice": "alice", "format": "pcm16"},
            messages=user([{"type": "text", "text": "listen"}, part]),
        )

    assert ask(allowed).choices[0].message.audio.data
    assert ask(f"file://{allowed}").choices[0].message.audio.data
    assert ask(allowed, kind="audio").choices[0].message.audio.data
    for reference in (
        str(outside),
        f"file://{outside}",
        str(sneaky),
        f"{media_dir}/../{outside.parent.name}/secret.wav",
    ):
        with pytest.raises(openai.BadRequestError, match="is not allowed; the server reads"):
            ask(reference)
    with pytest.raises(openai.BadRequestError, match="no such file"):
        ask(str(media_dir / "missing.wav"))
    with pytest.raises(openai.BadRequestError, match="unsupported URL scheme 'ftp'"):
        ask("ftp://example.com/a.wav")
