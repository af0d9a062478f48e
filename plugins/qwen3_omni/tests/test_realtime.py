"""``/v1/realtime`` on the qwen3-omni demo, driven by the official ``openai`` SDK's realtime client.

The user speaks with espeak-ng (real speech, not a tone), resampled to the
Realtime API's 24 kHz PCM. The model is the tiny random checkpoint: what it
says is meaningless, but every stage runs, so these check the protocol, the
turn detection and that cancelled responses free every process.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
np = pytest.importorskip("numpy")
sf = pytest.importorskip("soundfile")
openai = pytest.importorskip("openai")
pytest.importorskip("websockets")

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.serve.realtime.formats import resample  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_omni_demo.toml"
KEY = "sk-realtime-test"
LONG = 256  # the demo's cap (factory.max_tokens of its preprocessing stage)
RATE = 24000


def _speech(text: str, tmp: Path) -> bytes:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    path = tmp / f"{abs(hash(text))}.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    samples, rate = sf.read(path, dtype="int16")
    return resample(samples, rate, RATE).astype("<i2").tobytes()


def _silence(seconds: float) -> bytes:
    return bytes(int(seconds * RATE) * 2)


@pytest.fixture(scope="module")
def server():
    with short_private_dir() as base:
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO)
        with planned.serve(api_key=KEY) as live:
            yield live


@pytest.fixture(scope="module")
def hello(tmp_path_factory) -> bytes:
    return _speech("Hello there. Please tell me a short story.", tmp_path_factory.mktemp("s"))


def _client(server, key: str = KEY) -> Any:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


async def _append(conn: Any, pcm: bytes, chunk: int = 9600) -> None:
    for i in range(0, len(pcm), chunk):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + chunk]).decode())


async def _until(conn: Any, kind: str, seen: list | None = None, timeout: float = 60) -> Any:
    async with asyncio.timeout(timeout):
        async for event in conn:
            if seen is not None:
                seen.append(event)
            if event.type == kind:
                return event
    raise AssertionError(f"the connection closed before {kind}")


async def _manual_session(conn: Any, **session: Any) -> None:
    assert (await conn.recv()).type == "session.created"
    config = {"type": "realtime", "audio": {"input": {"turn_detection": None}}, **session}
    await conn.session.update(session=config)
    assert (await conn.recv()).type == "session.updated"


def _idle(server) -> bool:
    """Every stage of every process and its engine: nothing running, nothing waiting."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{server.url}/health") as answer:
            health = json.load(answer)
        busy = [
            (name, stage)
            for name, info in health["processes"].items()
            for stage, depth in info["queue"].items()
            if any(depth.values())
        ]
        if not busy and health["inflight"] == 0:
            return True
        time.sleep(0.2)
    return False


def test_a_spoken_turn_then_a_text_turn_in_one_session(server, hello) -> None:
    async def turns() -> tuple[list, list]:
        async with _client(server).realtime.connect(model="tiny") as conn:
            # greedy: sampled, the random talker drew its end of speech at the first frame
            # in about 1 run in 16, a turn without audio (greedy, it speaks ~4 s)
            await _manual_session(conn, max_output_tokens=12, temperature=0)
            await _append(conn, hello)
            await conn.input_audio_buffer.commit()
            spoken: list = []
            await _until(conn, "input_audio_buffer.committed", spoken)
            await conn.response.create()
            await _until(conn, "response.done", spoken)
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "And now in writing?"}],
                }
            )
            written: list = []
            await conn.response.create(response={"output_modalities": ["text"]})
            await _until(conn, "response.done", written)
            return spoken, written

    spoken, written = asyncio.run(turns())
    done = spoken[-1].response
    # a turn that failed or was cancelled says why here, not as "no audio" below
    # (12 tokens may end it as incomplete: max_output_tokens)
    assert done.status in ("completed", "incomplete"), (done.status, done.status_details)
    kinds = [e.type for e in spoken]
    order = [
        "input_audio_buffer.committed",
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert [k for k in kinds if k in order] == sorted(
        (k for k in kinds if k in order), key=order.index
    )
    audio = b"".join(
        base64.b64decode(e.delta) for e in spoken if e.type == "response.output_audio.delta"
    )
    assert len(audio) > RATE // 10 and len(audio) % 2 == 0
    transcript = "".join(
        e.delta for e in spoken if e.type == "response.output_audio_transcript.delta"
    )
    done = spoken[-1].response
    assert done.status in ("completed", "incomplete")
    # 3.7 s of speech is ~37 audio tokens (the release hears 25 a second) plus the template
    assert done.usage.output_tokens >= 1 and done.usage.input_tokens > 30
    assert done.output[0].content[0].transcript == transcript
    text = "".join(e.delta for e in written if e.type == "response.output_text.delta")
    final = written[-1].response
    assert text and final.output[0].content[0].text == text
    assert "response.output_audio.delta" not in {e.type for e in written}
    # the second prompt heard the first turn too: more input tokens than the first
    assert final.usage.input_tokens > done.usage.input_tokens


async def _spoken_turn(server: Any, pcm: bytes, session: dict, response: dict) -> tuple:
    """One committed turn's (transcript, audio bytes) in a session of its own."""
    async with _client(server).realtime.connect(model="tiny") as conn:
        await _manual_session(conn, max_output_tokens=8, **session)
        await _append(conn, pcm)
        await conn.input_audio_buffer.commit()
        await conn.response.create(response=response)
        seen: list = []
        await _until(conn, "response.done", seen)
    audio = b"".join(
        base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta"
    )
    return seen[-1].response.output[0].content[0].transcript, audio


def test_temperature_zero_says_the_same_thing_twice(server, hello) -> None:
    """The beta API's temperature reaches the pipeline, set on the session or on one
    response: greedy, two sessions hearing the same turn answer with the same words and
    the same audio, sample for sample (the thinker and the talker both decode greedily)."""

    async def both() -> tuple:
        by_session = await _spoken_turn(server, hello, {"temperature": 0}, {})
        by_response = await _spoken_turn(server, hello, {}, {"temperature": 0})
        return by_session, by_response

    (words, audio), (words_again, audio_again) = asyncio.run(both())
    assert words and len(audio) > RATE // 10
    assert (words, audio) == (words_again, audio_again)


def test_response_cancel_ends_it_cancelled_and_frees_every_process(server, hello) -> None:
    async def cancel() -> Any:
        async with _client(server).realtime.connect(model="tiny") as conn:
            await _manual_session(conn, temperature=0)  # greedy: a long answer every time
            await _append(conn, hello)
            await conn.input_audio_buffer.commit()
            await conn.response.create(response={"max_output_tokens": LONG})
            # in flight: its first words are on the way (a whole answer takes seconds)
            await _until(conn, "response.output_audio_transcript.delta")
            await conn.response.cancel()
            return (await _until(conn, "response.done")).response

    response = asyncio.run(cancel())
    assert response.status == "cancelled"
    assert response.status_details.reason == "client_cancelled"
    assert _idle(server)


def test_server_vad_finds_the_turn_and_answers_by_itself(server, hello) -> None:
    async def vad() -> list:
        async with _client(server).realtime.connect(model="tiny") as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.session.update(
                session={
                    "type": "realtime",
                    "max_output_tokens": 6,
                    "audio": {
                        "input": {
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 400}
                        }
                    },
                }
            )
            seen: list = []
            await _until(conn, "session.updated", seen)
            await _append(conn, _silence(1.0) + hello + _silence(1.5))
            await _until(conn, "response.done", seen)
            return seen

    seen = asyncio.run(vad())
    kinds = [e.type for e in seen]
    assert (
        kinds.index("input_audio_buffer.speech_started")
        < kinds.index("input_audio_buffer.speech_stopped")
        < kinds.index("input_audio_buffer.committed")
        < (kinds.index("response.created"))
    )
    started = next(e for e in seen if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in seen if e.type == "input_audio_buffer.speech_stopped")
    committed = next(e for e in seen if e.type == "input_audio_buffer.committed")
    # both name the user item the turn becomes (a string: strict clients refuse a null)
    assert isinstance(started.item_id, str)
    assert started.item_id == stopped.item_id == committed.item_id
    # a GA client hears of each new item as conversation.item.added (beta: ...created)
    assert kinds.count("conversation.item.added") == 2 and "conversation.item.created" not in kinds
    speech_ms = len(hello) / 2 / RATE * 1000
    assert 300 <= started.audio_start_ms <= 1100  # 1 s of silence, 300 ms prefix padding
    assert stopped.audio_end_ms - started.audio_start_ms >= speech_ms * 0.6
    assert seen[-1].response.status in ("completed", "incomplete")


def test_speaking_over_an_answer_cancels_it(server, hello) -> None:
    async def barge_in() -> tuple[Any, float]:
        async with _client(server).realtime.connect(model="tiny") as conn:
            await _manual_session(conn)
            await conn.session.update(
                session={
                    "type": "realtime",
                    "audio": {
                        "input": {
                            "turn_detection": {"type": "server_vad", "create_response": False}
                        }
                    },
                }
            )
            await _until(conn, "session.updated")
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Tell me a long story."}],
                }
            )
            await conn.response.create(response={"max_output_tokens": LONG})
            # speak as soon as the answer is under way (a tiny random talker may end its
            # audio early; waiting for its first audio could let the whole answer finish)
            await _until(conn, "response.created")
            await _append(conn, hello)
            arrived: dict[str, float] = {}
            async with asyncio.timeout(60):
                async for event in conn:
                    arrived.setdefault(event.type, time.monotonic())
                    if event.type == "response.done":
                        response = event.response
                        break
            assert "input_audio_buffer.speech_started" in arrived, sorted(arrived)
            spoke = arrived["input_audio_buffer.speech_started"]
            return response, arrived["response.done"] - spoke

    response, after = asyncio.run(barge_in())
    assert after >= 0  # the answer was still running when the speech was heard
    assert response.status == "cancelled"
    assert response.status_details.reason == "turn_detected"
    assert after < 5
    assert _idle(server)


def test_client_mistakes_get_error_events_and_the_session_goes_on(server) -> None:
    async def mistakes() -> tuple[list, Any]:
        async with _client(server).realtime.connect(model="tiny") as conn:
            await _manual_session(conn, max_output_tokens=4)
            errors = []
            await conn.send({"type": "no.such.event", "event_id": "evt_1"})
            errors.append(await _until(conn, "error"))
            await conn.send({"type": "input_audio_buffer.append", "audio": "%%% not base64"})
            errors.append(await _until(conn, "error"))
            await conn.send({"type": "session.update", "session": {"bogus_setting": 1}})
            errors.append(await _until(conn, "error"))
            await conn.send({"type": "input_audio_buffer.commit"})  # nothing in the buffer
            errors.append(await _until(conn, "error"))
            await conn.send({"type": "response.cancel"})  # nothing to cancel
            errors.append(await _until(conn, "error"))
            await conn.send({"type": "conversation.item.retrieve", "item_id": "item_none"})
            errors.append(await _until(conn, "error"))
            await conn.session.update(
                session={"type": "realtime", "audio": {"output": {"voice": "nobody-here"}}}
            )
            await _until(conn, "session.updated")
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                }
            )
            await conn.response.create()
            unknown_voice = await _until(conn, "error")
            failed = (await _until(conn, "response.done")).response
            await conn.session.update(
                session={"type": "realtime", "audio": {"output": {"voice": "ethan"}}}
            )
            await conn.response.create()
            still = (await _until(conn, "response.done")).response
            return [*errors, unknown_voice], (failed, still)

    errors, (failed, still) = asyncio.run(mistakes())
    codes = [e.error.code for e in errors]
    assert codes[:6] == [
        "invalid_event_type",
        "invalid_base64",
        "invalid_value",
        "input_audio_buffer_commit_empty",
        "response_cancel_not_active",
        "item_not_found",
    ]
    assert errors[0].error.event_id == "evt_1"
    assert errors[2].error.param == "session.bogus_setting"
    assert "nobody-here" in errors[6].error.message
    assert failed.status == "failed"
    assert still.status in ("completed", "incomplete")


def test_input_transcription_arrives_next_to_the_audio_item(server, hello) -> None:
    async def transcribed() -> tuple[Any, Any]:
        async with _client(server).realtime.connect(model="tiny") as conn:
            await _manual_session(
                conn, audio={"input": {"turn_detection": None, "transcription": {"model": "tiny"}}}
            )
            await _append(conn, hello)
            await conn.input_audio_buffer.commit()
            committed = await _until(conn, "input_audio_buffer.committed")
            done = await _until(conn, "conversation.item.input_audio_transcription.completed")
            return committed, done

    committed, done = asyncio.run(transcribed())
    assert done.item_id == committed.item_id and done.transcript  # random weights: any text


def test_a_wrong_key_is_refused_at_the_handshake(server) -> None:
    async def wrong() -> None:
        async with _client(server, key="sk-wrong").realtime.connect(model="tiny") as conn:
            await conn.recv()

    with pytest.raises(Exception) as refused:
        asyncio.run(wrong())
    assert "401" in str(refused.value) or "1008" in str(refused.value)


def test_a_beta_client_gets_the_beta_event_names(server) -> None:
    async def beta() -> Counter:
        async with _client(server).realtime.connect(model="tiny") as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.send(
                {
                    "type": "session.update",
                    "session": {
                        "modalities": ["text"],
                        "input_audio_format": "pcm16",
                        "turn_detection": None,
                        "max_response_output_tokens": 5,
                    },
                }
            )
            await _until(conn, "session.updated")
            await conn.send(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "hi"}],
                    },
                }
            )
            await conn.send({"type": "response.create"})
            seen: list = []
            await _until(conn, "response.done", seen)
            return Counter(e.type for e in seen)

    kinds = asyncio.run(beta())
    assert kinds["response.text.delta"] >= 1 and kinds["response.text.done"] == 1
    assert "response.output_text.delta" not in kinds
    # the user's item and the answer's, under the beta name of conversation.item.added
    assert kinds["conversation.item.created"] == 2 and "conversation.item.added" not in kinds


@pytest.mark.slow
def test_twenty_sessions_at_once_each_get_their_answer(server, hello) -> None:
    async def one(index: int) -> Any:
        async with _client(server).realtime.connect(model="tiny") as conn:
            await _manual_session(conn, max_output_tokens=6)
            await _append(conn, hello[: len(hello) // 2])
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            return (await _until(conn, "response.done", timeout=180)).response

    async def all_of_them() -> list:
        return await asyncio.gather(*(one(i) for i in range(20)))

    responses = asyncio.run(all_of_them())
    assert len({r.id for r in responses}) == 20
    assert all(r.status in ("completed", "incomplete") and r.output for r in responses)
    assert _idle(server)


def test_a_user_item_with_a_video_is_seen_and_heard(server) -> None:
    """``input_video`` (a data: URL, our addition beside OpenAI's ``input_image``) reaches the
    model as a chat ``video_url`` part: the prompt holds its frames and its sound track."""
    pytest.importorskip("av")
    from media_samples import mp4_bytes

    t = np.arange(16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    url = "data:video/mp4;base64," + base64.b64encode(mp4_bytes(1.0, sound=tone)).decode()

    async def ask(content: list[dict]) -> Any:
        async with _client(server).realtime.connect(model="tiny") as conn:
            await _manual_session(conn, max_output_tokens=2, output_modalities=["text"])
            item = {"type": "message", "role": "user", "content": content}
            await conn.conversation.item.create(item=item)
            await conn.response.create()
            return (await _until(conn, "response.done")).response

    question = {"type": "input_text", "text": "What moves?"}
    seen = asyncio.run(ask([{"type": "input_video", "video_url": url}, question]))
    plain = asyncio.run(ask([question]))
    assert seen.status in ("completed", "incomplete")
    # 4 frames of 20 x 28 patches (280 tokens) and 13 audio tokens, with their markers
    assert seen.usage.input_tokens - plain.usage.input_tokens >= 280 + 13
