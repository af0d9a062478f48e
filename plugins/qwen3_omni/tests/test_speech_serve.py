"""Spoken answers over HTTP through the official ``openai`` client (qwen3-omni demo, CPU)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")
soundfile = pytest.importorskip("soundfile")

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_omni_demo.toml"
# Seven processes started for the module: with the slow set (make test-all);
# test_speech_pipeline covers the same speech path through the runtime in make test.
pytestmark = pytest.mark.slow
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def server():
    with short_private_dir() as base:
        flags = ["--talker_ar.factory.max_frames", "30"]
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)
        with planned.serve() as live:
            yield live


def _chat(server, voice: str = "ethan", **kw):
    return server.client().chat.completions.create(
        model="tiny",
        messages=HELLO,
        modalities=["text", "audio"],
        audio={"voice": voice, "format": kw.pop("format", "wav")},
        max_tokens=8,
        temperature=0,
        **kw,
    )


def test_a_spoken_answer_has_its_transcript_and_24_khz_audio(server):
    reply = _chat(server)
    message = reply.choices[0].message
    wav, rate = soundfile.read(io.BytesIO(base64.b64decode(message.audio.data)))
    assert rate == 24000 and wav.size > 0
    assert message.audio.transcript == message.content and message.content
    assert reply.usage.completion_tokens == 8


def test_streamed_text_and_audio_deltas_add_up_to_the_whole_answer(server):
    whole = _chat(server, voice="chelsie")
    text, pcm = [], bytearray()
    for chunk in _chat(server, voice="chelsie", stream=True, format="pcm16"):
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            audio = getattr(choice.delta, "audio", None)
            data = getattr(audio, "data", None) if audio is not None else None
            if data:
                pcm += base64.b64decode(data)
    assert "".join(text) == whole.choices[0].message.content
    streamed = np.frombuffer(bytes(pcm), dtype="<i2")
    full, _ = soundfile.read(io.BytesIO(base64.b64decode(whole.choices[0].message.audio.data)))
    assert streamed.size == full.size > 0  # the same samples, streamed as they were made


def test_the_voice_is_chosen_per_request(server):
    ethan = _chat(server, voice="ethan").choices[0].message.audio.data
    aiden = _chat(server, voice="Aiden").choices[0].message.audio.data
    assert ethan != aiden


def test_an_unknown_voice_is_refused_with_the_speakers_listed(server):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(server, voice="bob")
    message = caught.value.body["message"]
    assert "unknown voice 'bob'" in message and "aiden, chelsie, ethan" in message
    assert "server.voice_aliases" in message


def test_a_token_cap_is_length_whether_or_not_audio_was_asked_for(server):
    """The talker ends "stop" once it spoke the capped text: the text's "length" stands."""
    spoken = _chat(server)
    assert spoken.usage.completion_tokens == 8
    assert spoken.choices[0].finish_reason == "length"
    chunks = list(_chat(server, stream=True, format="pcm16"))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    text = server.client().chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=8, temperature=0
    )
    assert text.choices[0].finish_reason == "length"


def test_text_only_chat_and_the_speech_endpoint_on_the_same_server(server):
    # greedy both: sampled, the random talker ends its speech at the first frame now and
    # then (an empty wav, ~1 in 200 here)
    text = server.client().chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=4, temperature=0
    )
    assert text.choices[0].message.audio is None and text.choices[0].message.content
    speech = server.client().audio.speech.create(
        model="tiny", voice="ethan", input="Say hi", extra_body={"temperature": 0}
    )
    wav, rate = soundfile.read(io.BytesIO(speech.content))
    assert rate == 24000 and wav.size > 0


def test_spoken_chat_streams_dropped_mid_answer_leave_all_seven_processes_idle(server):
    from drops import drop_streams_then_wait_idle

    body = {
        "model": "tiny",
        "messages": HELLO,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "pcm16"},
        "max_tokens": 24,
        "stream": True,
    }
    drop_streams_then_wait_idle(server.url, body, 20)


def _thinker_copied(server, stage: str = "thinker") -> float:
    """A stage's copied prompt positions once two reports agree (heartbeats, 0.5 s)."""
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    last = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as reply:
            families = text_string_to_metric_families(reply.read().decode())
        copied = sum(
            sample.value
            for family in families
            for sample in family.samples
            if sample.name == "omni_engine_prompt_positions_total"
            and sample.labels["stage"] == stage
            and sample.labels["source"] == "cached"
        )
        if copied == last:
            return copied
        last = copied
        time.sleep(1.1)
    raise AssertionError(f"the {stage}'s copied positions kept changing: {last}")


def test_a_voice_conversation_copies_the_earlier_turn_audio_included(server):
    """Turn 2 of a spoken chat sends turn 1 (the user's audio in it) back: the thinker
    copies that head with the talker's rows at its audio positions, the talker copies turn
    1's user segment its own prompt starts with, and both turns speak."""
    from media_samples import audio_part, user

    first = user(audio_part(1.0), text="What did I say?")
    client = server.client()
    spoken = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}
    one = client.chat.completions.create(
        model="tiny", messages=first, max_tokens=4, temperature=0, **spoken
    )
    second = [
        *first,
        {"role": "assistant", "content": one.choices[0].message.content},
        {"role": "user", "content": "Say it again."},
    ]
    before, talker_before = _thinker_copied(server), _thinker_copied(server, "talker_ar")
    two = client.chat.completions.create(
        model="tiny", messages=second, max_tokens=4, temperature=0, **spoken
    )
    copied = _thinker_copied(server) - before
    assert copied >= 16 * ((one.usage.prompt_tokens - 1) // 16) > 0
    # the talker's prompt starts with turn 1's user segment (answers are left out): it
    # copies that segment's whole blocks from turn 1's slot
    assert _thinker_copied(server, "talker_ar") - talker_before >= 16
    for reply in (one, two):
        wav, rate = soundfile.read(
            io.BytesIO(base64.b64decode(reply.choices[0].message.audio.data))
        )
        assert rate == 24000 and wav.size > 0


def test_a_spoken_prompt_longer_than_a_steps_budget_is_prefilled_in_chunks(server):
    """With 16 positions per step, a spoken question with audio is prefilled in chunks; the
    talker gets rows for the whole prompt (the thinker keeps its rows at media positions
    in a speech deployment) and speaks the transcript the one-step prefill gives."""
    from media_samples import audio_part, user

    messages = user(audio_part(1.0), text="What did I say?")
    spoken = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}

    def ask(live):
        return live.client().chat.completions.create(
            model="tiny", messages=messages, max_tokens=4, temperature=0, **spoken
        )

    whole = ask(server)
    assert whole.usage.prompt_tokens > 2 * 16
    with short_private_dir() as base:
        flags = [
            "--talker_ar.factory.max_frames",
            "30",
            "--thinker.engine.max_prefill_tokens",
            "16",
        ]
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)
        with planned.serve() as live:
            chunked = ask(live)
    assert chunked.choices[0].message.content == whole.choices[0].message.content
    wav, rate = soundfile.read(io.BytesIO(base64.b64decode(chunked.choices[0].message.audio.data)))
    assert rate == 24000 and wav.size > 0
