"""``/v1/audio/speech/stream``: the ``websockets`` client against a live uvicorn server.

Most tests run on ``t-ws-speech`` (:mod:`omni_test_ws`: a seeded tone per
character, so audio is fixed by text and seed), served with an API key, a
1 s ``server.ws_send_timeout`` and a 1 s ``server.body_timeout`` (a
WebSocket must outlive the HTTP body deadline). One test runs the real
Qwen3-TTS tiny demo.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.client import connect

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import omni_test_ws as tw  # noqa: E402

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.schema.deployment import ServerConfig  # noqa: E402
from omni_core.serve.speech.stream import MAX_IN_FLIGHT, PATH, SUBPROTOCOL  # noqa: E402
from omni_core.testing import LiveServer, plan_on_cpu, short_private_dir  # noqa: E402

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
DEMO = HERE.parents[1] / "examples" / "qwen3_tts_demo.toml"


@pytest.fixture(scope="module")
def ws_server() -> Iterator[LiveServer]:
    plugins = OmniPlugins(env={})
    plugins.register(tw, tw.HERE)
    flags = ["--server.ws_send_timeout", "1", "--server.body_timeout", "1"]
    with short_private_dir() as base:
        planned = plan_on_cpu(
            plugins,
            base,
            pipeline="t-ws-speech",
            flags=flags,
            policy=None,
            plugin_modules=[tw.HERE],
        )
        with planned.serve(api_key=KEY) as live:
            yield live


def ws_url(server: LiveServer) -> str:
    return server.url.replace("http://", "ws://", 1) + PATH


def streams(server: LiveServer) -> Any:
    return server.server.config.app.state.speech_streams


@dataclass
class Heard:
    """What a session sent back: events in order, each segment's audio, arrival times."""

    events: list[dict[str, Any]] = field(default_factory=list)
    audio: dict[int, bytes] = field(default_factory=dict)
    first_audio_at: float | None = None
    close_code: int | None = None

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["type"] == kind]

    @property
    def pcm(self) -> bytes:
        return b"".join(self.audio[i] for i in sorted(self.audio))


async def listen(ws: Any, heard: Heard) -> None:
    """Read until the server closes; binary audio belongs to the segment last started."""
    current = -1
    try:
        async for message in ws:
            if isinstance(message, bytes):
                heard.first_audio_at = heard.first_audio_at or time.monotonic()
                heard.audio[current] = heard.audio.get(current, b"") + message
                continue
            event = json.loads(message)
            heard.events.append(event)
            if event["type"] == "segment.started":
                current = event["segment"]
    finally:
        heard.close_code = ws.close_code


async def session(
    server: LiveServer, messages: list[Any], *, pause: float = 0.0, **connect_kw: Any
) -> tuple[Heard, float]:
    """Send ``messages`` (dicts as JSON, str and bytes as they are) ``pause`` s apart, read all.

    Returns what was heard and when the last message was sent.
    """
    heard = Heard()
    connect_kw.setdefault("additional_headers", AUTH)
    async with connect(ws_url(server), **connect_kw) as ws:
        reader = asyncio.ensure_future(listen(ws, heard))
        for index, message in enumerate(messages):
            if index and pause:
                await asyncio.sleep(pause)
            await ws.send(json.dumps(message) if isinstance(message, dict) else message)
        sent_last = time.monotonic()
        await asyncio.wait_for(reader, 60)
    return heard, sent_last


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def pieces(text: str, count: int) -> list[dict[str, Any]]:
    size = -(-len(text) // count)
    return [{"type": "input.text", "text": text[i : i + size]} for i in range(0, len(text), size)]


TEXT = "Hello there, friend. This sentence comes second! And the third one ends it."
SEGMENTS = ["Hello there, friend.", "This sentence comes second!", "And the third one ends it."]


# -- the stream ---------------------------------------------------------------------


def test_audio_starts_before_the_text_ends_and_equals_post_per_segment(ws_server):
    config = {"type": "session.config", "seed": 11, "voice": "bob", "test_chunk_delay": 0.01}
    messages = [config, *pieces(TEXT, 10), {"type": "input.done"}]
    heard, done_sent = run(session(ws_server, messages, pause=0.2))  # ten pieces over ~2 s
    assert heard.first_audio_at is not None and heard.first_audio_at < done_sent
    assert [e["text"] for e in heard.of("segment.started")] == SEGMENTS
    assert [e["segment"] for e in heard.of("segment.done")] == [0, 1, 2]
    assert all(e["finish_reason"] == "stop" for e in heard.of("segment.done"))
    created = heard.of("session.created")[0]
    assert created["sample_rate"] == tw.SAMPLE_RATE and created["response_format"] == "pcm"
    client = ws_server.client(api_key=KEY)
    for index, text in enumerate(SEGMENTS):
        body = {"seed": 11, "test_chunk_delay": 0.01}
        alone = client.audio.speech.create(
            model="t-ws-speech", input=text, voice="bob", response_format="pcm", extra_body=body
        ).content
        assert heard.audio[index] == alone, index
    seconds = len(heard.pcm) / 2 / tw.SAMPLE_RATE
    usage = heard.of("session.done")[0]["usage"]
    assert usage == {
        "segments": 3,
        "characters": sum(map(len, SEGMENTS)),
        "audio_seconds": pytest.approx(seconds, abs=0.01),
        "failed": 0,
    }
    assert heard.close_code == 1000
    assert heard.events[-1]["type"] == "session.done"


def test_the_next_segment_is_made_while_the_current_one_streams_two_at_most(ws_server):
    config = {"type": "session.config", "test_chunk_delay": 0.4}  # 1.2 s per 4-chunk segment
    text = "Abc def ghi jk. " * 4  # four segments of 15 characters: four chunks each
    messages = [config, {"type": "input.text", "text": text}, {"type": "input.done"}]
    inflight: list[int] = []

    async def watch(stop: asyncio.Event) -> None:
        while not stop.is_set():
            inflight.append(ws_server.runtime.coordinator.inflight)
            await asyncio.sleep(0.02)

    async def scenario() -> tuple[Heard, float]:
        stop = asyncio.Event()
        watcher = asyncio.ensure_future(watch(stop))
        started = time.monotonic()
        heard, _ = await session(ws_server, messages)
        stop.set()
        await watcher
        return heard, time.monotonic() - started

    heard, seconds = run(scenario())
    assert len(heard.of("segment.done")) == 4
    assert seconds < 3.5  # one after the other: 4 x 1.2 s
    assert max(inflight) == MAX_IN_FLIGHT


def test_events_come_in_segment_order_with_audio_between(ws_server):
    messages = [{"type": "input.text", "text": TEXT}, {"type": "input.done"}]
    heard, _ = run(session(ws_server, messages))  # no session.config: the defaults
    kinds = [(e["type"], e.get("segment")) for e in heard.events]
    assert kinds == [
        ("session.created", None),
        *[(kind, i) for i in range(3) for kind in ("segment.started", "segment.done")],
        ("session.done", None),
    ]
    for index, text in enumerate(SEGMENTS):  # samples per character, from the test pipeline
        assert len(heard.audio[index]) == 2 * tw.SAMPLES_PER_CHAR * len(text)


def test_base64_wav_clauses(ws_server):
    config = {
        "type": "session.config",
        "response_format": "wav",
        "audio_transport": "base64",
        "split": "clause",
    }
    messages = [config, {"type": "input.text", "text": "One, two: three."}, {"type": "input.done"}]
    heard, _ = run(session(ws_server, messages))
    assert [e["text"] for e in heard.of("segment.started")] == ["One,", "two:", "three."]
    import base64

    for index in range(3):
        audio = b"".join(
            base64.b64decode(e["audio"]) for e in heard.of("audio") if e["segment"] == index
        )
        assert audio[:4] == b"RIFF" and audio[8:12] == b"WAVE"  # each segment a WAV stream
        assert len(audio) - 44 == 2 * tw.SAMPLES_PER_CHAR * len(["One,", "two:", "three."][index])
    assert not heard.audio  # nothing in binary frames


def test_session_close_stops_at_once(ws_server):
    config = {"type": "session.config", "test_chunk_delay": 1.0}
    text = "A slow first sentence that takes a while. And more."
    messages = [config, {"type": "input.text", "text": text}, {"type": "session.close"}]
    started = time.monotonic()
    heard, _ = run(session(ws_server, messages))
    assert time.monotonic() - started < 5  # not the ~12 s the first sentence would take
    assert heard.events[-1]["type"] == "session.done" and heard.close_code == 1000
    wait_until(lambda: ws_server.runtime.coordinator.inflight == 0)


# -- errors -------------------------------------------------------------------------


def test_bad_messages_get_an_error_and_the_socket_stays_usable(ws_server):
    bad = [
        ("not json", None, "not valid JSON"),
        ("[1, 2]", None, "must be a JSON object"),
        ({"no": "type"}, "type", "unknown message type none"),
        ({"type": "input.nonsense"}, "type", "unknown message type 'input.nonsense'"),
        (b"\x00\x01", None, "binary messages"),
        ({"type": "session.config", "response_format": "ogg"}, "response_format", "ogg"),
        ({"type": "session.config", "input": "Hello"}, "input", "input.text"),
        ({"type": "session.config", "split": "word"}, "split", "word"),
        ({"type": "session.config", "model": "gpt-4o-mini-tts"}, "model", "not served"),
    ]
    slow = {"type": "session.config", "seed": 5, "test_chunk_delay": 0.2}  # the session starts
    after = [
        ({"type": "session.config", "seed": 6}, "type", "already configured"),
        ({"type": "input.text"}, "text", "needs 'text'"),
        ({"type": "input.text", "text": 5}, "text", "needs 'text'"),
        ({"type": "input.text", "text": "x" * 70000}, "text", "at most 65536"),
    ]
    good = {"type": "input.text", "text": "Still works."}
    late = [
        ({"type": "session.config"}, "type", "before the first input.text"),
    ]
    done = {"type": "input.done"}
    ended = [
        ({"type": "input.text", "text": "Too late."}, "type", "input.done was sent"),
        (done, "type", "already sent"),
    ]
    cases = bad + after + late + ended
    messages = [m for m, _, _ in bad] + [slow] + [m for m, _, _ in after] + [good]
    messages += [m for m, _, _ in late] + [done] + [m for m, _, _ in ended]
    heard, _ = run(session(ws_server, messages))
    errors = heard.of("error")
    assert len(errors) == len(cases), [e["message"] for e in errors]
    for error, (_, param, words) in zip(errors, cases, strict=True):
        assert error["param"] == param and words in error["message"], error
        assert error["status"] in (400, 404) and "segment" not in error
    assert [e["text"] for e in heard.of("segment.started")] == ["Still works."]
    assert heard.of("session.done")[0]["usage"]["segments"] == 1
    assert heard.close_code == 1000


def test_a_refused_segment_gets_an_error_and_the_session_goes_on(ws_server):
    config = {"type": "session.config", "test_refuse": "BAD"}
    text = "Good one first. Then a BAD one. Fine again."
    messages = [config, {"type": "input.text", "text": text}, {"type": "input.done"}]
    heard, _ = run(session(ws_server, messages))
    (error,) = heard.of("error")
    assert error["segment"] == 1 and error["status"] == 400
    assert "refuses text with 'BAD'" in error["message"]
    reasons = [e["finish_reason"] for e in heard.of("segment.done")]
    assert reasons == ["stop", "error", "stop"]
    assert sorted(heard.audio) == [0, 2]
    usage = heard.of("session.done")[0]["usage"]
    assert (usage["segments"], usage["failed"]) == (2, 1)


# -- auth, routes, deadlines --------------------------------------------------------


def test_the_api_key_is_required(ws_server):
    async def refused(**kw: Any) -> Any:
        with pytest.raises(websockets.InvalidStatus) as caught:
            async with connect(ws_url(ws_server), **kw):
                pass
        return caught.value.response

    response = run(refused())
    assert response.status_code == 401
    assert "missing API key" in json.loads(response.body)["error"]["message"]
    response = run(refused(additional_headers={"Authorization": "Bearer wrong"}))
    assert response.status_code == 401
    assert json.loads(response.body)["error"]["code"] == "invalid_api_key"
    response = run(refused(subprotocols=[SUBPROTOCOL, "bearer.wrong"]))
    assert response.status_code == 401


def test_a_browser_sends_the_key_as_a_subprotocol(ws_server):
    async def scenario() -> str | None:
        async with connect(ws_url(ws_server), subprotocols=[SUBPROTOCOL, f"bearer.{KEY}"]) as ws:
            await ws.send(json.dumps({"type": "input.done"}))
            events = [json.loads(m) async for m in ws]
            assert [e["type"] for e in events] == ["session.created", "session.done"]
            return ws.subprotocol

    assert run(scenario()) == SUBPROTOCOL  # the key is never echoed


def test_a_pipeline_without_speech_refuses_the_handshake(chat_server):
    async def scenario() -> Any:
        with pytest.raises(websockets.InvalidStatus) as caught:
            async with connect(ws_url(chat_server)):
                pass
        return caught.value.response

    response = run(scenario())
    assert response.status_code == 404
    assert "does not serve /v1/audio/speech/stream" in json.loads(response.body)["error"]["message"]


def test_a_session_outlives_the_http_body_deadline(ws_server):
    async def scenario() -> Heard:
        heard = Heard()
        async with connect(ws_url(ws_server), additional_headers=AUTH) as ws:
            reader = asyncio.ensure_future(listen(ws, heard))
            await asyncio.sleep(3.3)  # body_timeout 1 s + 2 s of grace
            await ws.send(json.dumps({"type": "input.text", "text": "Still here."}))
            await ws.send(json.dumps({"type": "input.done"}))
            await asyncio.wait_for(reader, 30)
        return heard

    heard = run(scenario())
    assert heard.close_code == 1000 and heard.of("segment.done")


def test_ws_send_timeout_must_be_positive():
    assert ServerConfig().ws_send_timeout == 10.0
    with pytest.raises(ValueError, match="ws_send_timeout must be > 0 seconds"):
        ServerConfig(ws_send_timeout=0)


# -- a client that stops reading ----------------------------------------------------


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_a_client_that_never_reads_is_disconnected_and_the_buffer_stays_bounded(ws_server):
    live = streams(ws_server)
    live.peak_buffered_bytes = 0
    stuck_before = live.outcomes["stuck"]
    host, port = ws_server.url.removeprefix("http://").rsplit(":", 1)
    sentences = " ".join(f"Sentence number {i} is here to make a lot of audio." for i in range(12))

    async def scenario() -> tuple[float, Any]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
        sock.connect((host, int(port)))
        # close_timeout: an interrupted run (the suite stopped) closes without waiting 10 s
        # for the stuck server's close frame
        async with connect(
            ws_url(ws_server), sock=sock, additional_headers=AUTH, max_queue=2, close_timeout=1
        ) as ws:
            config = {"type": "session.config", "test_samples_per_char": 6000}  # 12 KB a char
            await ws.send(json.dumps(config))
            await ws.send(json.dumps({"type": "input.text", "text": sentences}))
            await ws.send(json.dumps({"type": "input.done"}))
            stalled = time.monotonic()
            while live.outcomes["stuck"] == stuck_before and time.monotonic() - stalled < 15:
                await asyncio.sleep(0.05)  # never read
            ended = time.monotonic() - stalled
            with pytest.raises(websockets.ConnectionClosed) as caught:
                async with asyncio.timeout(10):
                    async for _ in ws:
                        pass
            return ended, caught.value

    ended, closed = run(scenario())
    assert ended < 10, "the stuck session was not ended"
    assert live.outcomes["stuck"] == stuck_before + 1
    assert 0 < live.peak_buffered_bytes <= live.buffer_limit
    assert live.buffer_limit == MAX_IN_FLIGHT * 2 * tw.SAMPLE_RATE * 2  # 2 s per segment
    wait_until(lambda: not live.sessions)
    assert live.buffered_bytes == 0
    wait_until(lambda: ws_server.runtime.coordinator.inflight == 0)  # its requests aborted
    assert closed.rcvd is None or closed.rcvd.code in (1008, 1011)


# -- the real model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_server() -> Iterator[LiveServer]:
    pytest.importorskip("omni_qwen3_tts")
    with short_private_dir() as base:
        flags = ["--preprocessing.factory.max_frames", "24"]
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)
        with planned.serve() as live:
            yield live


@pytest.mark.slow  # starts the qwen3-tts demo server (make test-all runs it)
def test_qwen3_tts_tiny_speaks_while_the_text_arrives(demo_server):
    text = "Hello there. This is the tiny model. Goodbye now."
    config = {"type": "session.config", "voice": "serena", "seed": 4}
    messages = [config, *pieces(text, 10), {"type": "input.done"}]
    heard, done_sent = run(session(demo_server, messages, pause=0.2, additional_headers={}))
    assert heard.first_audio_at is not None and heard.first_audio_at < done_sent
    texts = [e["text"] for e in heard.of("segment.started")]
    assert texts == ["Hello there.", "This is the tiny model.", "Goodbye now."]
    client = demo_server.client()
    alone = b"".join(
        client.audio.speech.create(
            model="tiny",
            input=segment,
            voice="serena",
            response_format="pcm",
            extra_body={"seed": 4},
        ).content
        for segment in texts
    )
    assert heard.pcm == alone
