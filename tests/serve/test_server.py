"""Models, health, metrics, auth, admission (429), unknown routes and client disconnects."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time

import openai
import pytest
from serve_helpers import raw


def test_models_lists_the_served_model(speech_server):
    models = speech_server.client().models.list().data
    assert [m.id for m in models] == ["t-speech"]
    assert models[0].owned_by == "omni"


def test_health_reports_every_process(speech_server):
    response = raw("GET", f"{speech_server.url}/health")
    assert response.status_code == 200
    health = response.json()
    assert health["status"] == "healthy" and health["pipeline"] == "t-speech"
    assert {name: p["stages"] for name, p in health["processes"].items()} == {
        "front": ["prep", "synth"],
        "back": ["audio"],
    }
    assert all(p["state"] == "healthy" for p in health["processes"].values())


def test_metrics_count_requests_latency_and_first_audio(speech_server):
    client = speech_server.client()
    client.audio.speech.create(model="t-speech", input="one two", voice="alice")
    with pytest.raises(openai.BadRequestError):
        client.audio.speech.create(model="t-speech", input="one two", voice="zed")
    text = raw("GET", f"{speech_server.url}/metrics").text

    def value(line_start: str) -> float:
        lines = [line for line in text.splitlines() if line.startswith(line_start)]
        assert lines, f"no metric line starts with {line_start!r}"
        return float(lines[0].rsplit(" ", 1)[1])

    assert value('omni_requests_total{endpoint="/v1/audio/speech",method="POST",status="200"}') >= 1
    assert value('omni_requests_total{endpoint="/v1/audio/speech",method="POST",status="400"}') >= 1
    assert value('omni_request_duration_seconds_count{endpoint="/v1/audio/speech"}') >= 2
    assert value('omni_time_to_first_audio_seconds_count{endpoint="/v1/audio/speech"}') >= 1
    assert (
        value('omni_time_to_first_audio_seconds_bucket{endpoint="/v1/audio/speech",le="+Inf"}') >= 1
    )
    assert value('omni_process_inflight_requests{process="front",replica="0"}') == 0
    assert value('omni_process_up{process="back",state="healthy"}') == 1
    assert value("omni_inflight_requests") == 0
    # every stage reports its queue depth once its process is up, and back to 0 once the
    # requests are done: reports are 0.5 s apart, so the one read first may predate the end
    # (seen on a loaded machine: a report from while the request ran)
    running = 'omni_stage_queue_depth{process="back",stage="audio",state="running"}'
    deadline = time.monotonic() + 5
    while running not in text or value(running) != 0:
        assert time.monotonic() < deadline, f"no {running} of 0 within 5 s"
        time.sleep(0.1)
        text = raw("GET", f"{speech_server.url}/metrics").text
    assert value('omni_stage_queue_depth{process="front",stage="synth",state="waiting"}') == 0


def test_unknown_routes_and_methods_answer_in_openai_shape(speech_server):
    missing = raw("GET", f"{speech_server.url}/v1/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "no such endpoint: /v1/nothing"
    wrong = raw("GET", f"{speech_server.url}/v1/audio/speech")
    assert wrong.status_code == 405 and "not allowed" in wrong.json()["error"]["message"]


def test_without_a_key_configured_no_header_is_needed(speech_server):
    response = raw("GET", f"{speech_server.url}/v1/models")
    assert response.status_code == 200


def test_auth_guards_every_route_but_health(guarded_server):
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        guarded_server.client("wrong").models.list()
    for path in ("/v1/models", "/metrics", "/v1/audio/speech"):
        response = raw("POST" if "speech" in path else "GET", f"{guarded_server.url}{path}")
        assert response.status_code == 401, path
        assert "missing API key" in response.json()["error"]["message"]
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert raw("GET", f"{guarded_server.url}/health").status_code == 200
    audio = guarded_server.client("sekret").audio.speech.create(
        model="t-speech", input="hi", voice="alice"
    )
    assert audio.content[:4] == b"RIFF"


def test_a_full_server_answers_429_at_once_then_serves_again(guarded_server):
    client = guarded_server.client("sekret")
    done: list[bytes] = []
    slow = threading.Thread(
        target=lambda: done.append(
            client.audio.speech.create(
                model="t-speech", input="slow one", voice="alice", extra_body={"test_delay": 5}
            ).content
        )
    )
    slow.start()
    deadline = time.monotonic() + 10
    while guarded_server.runtime.coordinator.inflight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        client.audio.speech.create(model="t-speech", input="fast", voice="alice")
    assert time.monotonic() - started < 4  # refused at once, not queued behind the 5 s one
    assert caught.value.status_code == 429
    assert "1 requests in flight, the limit is 1" in caught.value.message
    assert caught.value.response.headers["retry-after"] == "1"
    slow.join(30)
    assert done and done[0][:4] == b"RIFF"
    assert client.audio.speech.create(model="t-speech", input="again", voice="alice").content


def test_a_client_that_disconnects_aborts_its_request(speech_server):
    coordinator = speech_server.runtime.coordinator
    failed = coordinator.failed
    for stream in (False, True):
        with pytest.raises((TimeoutError, socket.timeout)):
            raw(
                "POST",
                f"{speech_server.url}/v1/audio/speech",
                timeout=0.5,
                json_body={"input": "slow", "voice": "alice", "test_delay": 30, "stream": stream},
            )
        deadline = time.monotonic() + 5
        while coordinator.inflight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert coordinator.inflight == 0  # aborted long before the stage's 30 s
    assert coordinator.failed == failed + 2


def test_keep_alive_responses_do_not_wait_for_delayed_acks(speech_server):
    """The listening socket must say it is TCP, or asyncio leaves Nagle on (~40 ms a reply)."""
    import http.client

    host, port = speech_server.url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/v1/models")
    assert connection.getresponse().read()
    # Asserted on the server's end of the connection, not by timing replies (a loaded
    # machine is slow with Nagle off too): its socket has TCP_NODELAY.
    client_end = connection.sock.getsockname()
    ends = [
        conn.transport.get_extra_info("socket")
        for conn in speech_server.server.server_state.connections
    ]
    [ours] = [sock for sock in ends if sock.getpeername() == client_end]
    assert ours.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    connection.close()


def test_a_client_that_leaves_a_stream_midway_aborts_its_request(speech_server):
    import http.client
    import json

    coordinator = speech_server.runtime.coordinator
    host, port = speech_server.url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    body = {"input": "word " * 50, "voice": "alice", "stream": True, "test_chunk_delay": 0.2}
    connection.request(
        "POST",
        "/v1/audio/speech",
        body=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.read(44)[:4] == b"RIFF"  # streaming has begun; the rest takes 10 s
    assert coordinator.inflight == 1
    connection.close()
    deadline = time.monotonic() + 3
    while coordinator.inflight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert coordinator.inflight == 0


def test_deeply_nested_json_is_a_400_naming_the_limit(chat_server):
    import urllib.error
    import urllib.request

    url = f"{chat_server.url}/v1/chat/completions"
    hello = '"messages": [{"role": "user", "content": "hi"}]'
    for nested in ("[" * 2000 + "]" * 2000, '{"a":' * 2000 + "1" + "}" * 2000):
        body = f'{{{hello}, "x": {nested}}}'.encode()
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            urllib.request.urlopen(request, timeout=30)
            raise AssertionError("a 2000-deep body was accepted")
        except urllib.error.HTTPError as error:
            assert error.code == 400
            message = json.loads(error.read())["error"]["message"]
        assert message == (
            "the request body nests arrays and objects 2001 levels deep; the limit is 64"
        )
    # Brackets inside strings do not count, and 64 levels are allowed.
    messages = [{"role": "user", "content": "[{" * 3000}]
    reply = raw("POST", url, json_body={"messages": messages})
    assert reply.status_code == 200, reply.text
    reply = raw(
        "POST", url, json_body={"messages": [{"role": "user", "content": "hi"}], "x": nest(63)}
    )
    assert reply.status_code == 200, reply.text


def nest(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_an_internal_error_is_a_500_with_a_request_id_and_no_details(caplog):
    """A bug in a handler: the client sees an id, the log the traceback under the same id."""
    import re

    from starlette.applications import Starlette
    from starlette.routing import Route

    from omni_core.serve.common.app import _guarded

    async def broken(request):
        raise RuntimeError("secret detail: /home/operator/key.pem")

    app = Starlette(routes=[Route("/boom", _guarded(broken))])
    caplog.set_level(logging.ERROR, logger="omni.serve")
    with serving(app) as url:
        reply = raw("GET", f"{url}/boom")
    assert reply.status_code == 500
    error = reply.json()["error"]
    assert error["type"] == "server_error"
    assert "secret" not in reply.text and "RuntimeError" not in reply.text
    match = re.fullmatch(r"internal server error \(request id ([0-9a-f]{16})\)", error["message"])
    assert match, error["message"]
    logged = [r for r in caplog.records if match.group(1) in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
    assert "secret detail" in str(logged[0].exc_info[1])


@contextlib.contextmanager
def serving(app):
    """``app`` on our uvicorn server (127.0.0.1, a free port) in a thread."""
    import anyio

    from omni_core.serve.server import bind, make_server, serve_runtime

    server = make_server(app, "", 0, grace=1)
    ready = threading.Event()
    urls: list[str] = []

    def started(found: list[str]) -> None:
        urls.extend(found)
        ready.set()

    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(
        target=anyio.run, args=(lambda: serve_runtime(server, [sock], on_started=started),)
    )
    thread.start()
    try:
        assert ready.wait(30), "the server did not start"
        yield urls[0]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def test_a_stage_s_bug_is_a_500_whose_details_stay_in_the_log(speech_server, caplog):
    """t-speech's first stage reads ``test_delay`` with float(): "soon" raises ValueError there."""
    import re

    caplog.set_level(logging.ERROR, logger="omni.serve")
    body = {"input": "hi", "voice": "alice", "test_delay": "soon"}
    reply = raw("POST", f"{speech_server.url}/v1/audio/speech", json_body=body)
    assert reply.status_code == 500
    message = reply.json()["error"]["message"]
    assert "ValueError" not in reply.text and "soon" not in reply.text
    match = re.fullmatch(r"internal server error \(request id (\S+)\); the server log .*", message)
    assert match, message
    logged = [r.getMessage() for r in caplog.records if match.group(1) in r.getMessage()]
    assert len(logged) == 1 and "ValueError" in logged[0] and "'soon'" in logged[0]
