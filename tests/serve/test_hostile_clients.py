"""What an untrusted client can learn and what it can make the log say, against a real server.

Clients learn the model's name, never a host path (the model directory, the
runtime directory); the start-up output keeps the paths for the operator. A
refused WebSocket handshake is one info line, not an error. A flood of
connections beyond the server's file limit leaves a bounded log and a
server that answers again once the flood is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from serve_helpers import OmniServe, raw
from websockets.asyncio.client import connect

from omni_core.serve.service import public_model_name
from omni_core.serve.speech.stream import PATH as STREAM_PATH

LAUNCH = [sys.executable, str(Path(__file__).parent / "omni_launch.py")]


@contextlib.contextmanager
def serving(base: Path, *args: str, nofile: int | None = None) -> Iterator[OmniServe]:
    """``omni serve --pipeline t-speech`` as a subprocess; ``nofile`` caps its descriptors."""
    served = OmniServe(base, ("--pipeline", "t-speech"), args, command=tuple(LAUNCH), nofile=nofile)
    try:
        yield served
    finally:
        served.stop()


# -- no host paths -------------------------------------------------------------------


def test_no_response_names_a_host_path(short_tmp, tmp_path):
    model_dir = tmp_path / "checkpoints" / "my-tts-model"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")  # a (tiny) local checkpoint
    with serving(short_tmp, "--model_path", str(model_dir)) as served:
        run_dirs = [p for p in (short_tmp / "run").iterdir() if p.name.startswith("t-speech-")]
        bodies = {
            path: raw("GET", served.url + path)
            for path in (
                "/v1/models",
                "/v1/deployment",
                "/v1/deployment.svg",
                "/health",
                "/metrics",
                "/",
                "/playground",
            )
        }
        wrong_model = raw(
            "POST",
            served.url + "/v1/audio/speech",
            json_body={"model": "other", "input": "hi", "voice": "bob"},
        )
        by_name = raw(
            "POST",
            served.url + "/v1/audio/speech",
            json_body={"model": "my-tts-model", "input": "hi", "voice": "bob"},
        )
        by_path = raw(  # a client that was told the path before still works
            "POST",
            served.url + "/v1/audio/speech",
            json_body={"model": str(model_dir), "input": "hi", "voice": "bob"},
        )
    assert len(run_dirs) == 1
    assert all(reply.status_code == 200 for reply in bodies.values()), {
        path: reply.status_code for path, reply in bodies.items()
    }
    assert wrong_model.status_code == 404 and "'my-tts-model'" in wrong_model.text
    assert by_name.status_code == 200 and by_path.status_code == 200
    for path, reply in [*bodies.items(), ("a 404", wrong_model)]:
        for secret in (str(tmp_path), str(short_tmp), str(run_dirs[0]), run_dirs[0].name):
            assert secret not in reply.text, f"{path} shows {secret}"
    assert bodies["/v1/models"].json()["data"][0]["id"] == "my-tts-model"
    assert bodies["/v1/deployment"].json()["model"] == "my-tts-model"
    assert "model my-tts-model" in bodies["/v1/deployment.svg"].text
    log = served.stderr()  # the operator's side keeps them
    assert f"model {model_dir} (clients see 'my-tts-model')" in log
    assert f"runtime directory {run_dirs[0]}" in log


@pytest.mark.parametrize(
    ("model_path", "shown"),
    [
        ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", "Qwen/Qwen3-TTS-12Hz-0.6B-Base"),  # a hub id
        ("tiny", "tiny"),  # a preset
        ("/srv/models/qwen-tts/", "qwen-tts"),
        ("~/ckpt", "ckpt"),
        ("./models/a/b", "b"),
        ("", ""),
    ],
)
def test_public_model_name(model_path, shown):
    assert public_model_name(model_path) == shown


# -- refused handshakes --------------------------------------------------------------


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def recording(name: str, level: int) -> Iterator[list[logging.LogRecord]]:
    logger, handler = logging.getLogger(name), Records()
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


async def refused(url: str, **kw: Any) -> int:
    with pytest.raises(websockets.InvalidStatus) as caught:
        async with connect(url, **kw):
            pass
    return caught.value.response.status_code


def test_a_refused_handshake_is_one_info_line_and_no_error(guarded_server):
    ws = guarded_server.url.replace("http://", "ws://", 1)
    key = {"Authorization": "Bearer sekret"}

    async def three() -> list[int]:
        return [
            await refused(ws + STREAM_PATH),  # no key
            await refused(ws + STREAM_PATH, additional_headers={"Authorization": "x"}),
            await refused(ws + "/no/such/socket", additional_headers=key),
        ]

    with (
        recording("uvicorn.error", logging.WARNING) as uvicorn_records,
        recording("omni.serve", logging.INFO) as ours,
    ):
        statuses = asyncio.run(three())
        time.sleep(0.5)  # uvicorn complained after the application returned
    assert statuses == [401, 401, 404]
    assert [r.getMessage() for r in uvicorn_records] == []
    handshakes = [r for r in ours if "WebSocket handshake" in r.getMessage()]
    assert [r.levelno for r in handshakes] == [logging.INFO] * 3
    lines = [r.getMessage() for r in handshakes]
    assert all(line.startswith("refused a WebSocket handshake from 127.0.0.1:") for line in lines)
    assert "missing API key" in lines[0] and "invalid API key" in lines[1]
    assert "to /no/such/socket: 404 no such endpoint" in lines[2]


# -- out of file descriptors ---------------------------------------------------------

NOFILE = 96  # the server and its two children start with ~20 descriptors each
FLOOD = 200


def test_a_flood_past_the_file_limit_leaves_a_short_log_and_a_server_that_recovers(short_tmp):
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FLOOD + 100:
        pytest.skip(f"this test process may open only {soft} files")
    with serving(short_tmp, nofile=NOFILE) as served:
        host, port = served.url.removeprefix("http://").rsplit(":", 1)
        clients = []
        for _ in range(FLOOD):
            client = socket.socket()
            client.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                client.connect((host, int(port)))
            clients.append(client)
        time.sleep(2)  # the accept loop fails and retries meanwhile
        for client in clients:
            client.close()
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError):
                if raw("GET", served.url + "/health", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the server did not recover"
            time.sleep(0.2)
        during = served.stderr()
    log = served.stderr()
    assert "socket.accept() out of system resource" in during  # the flood did exhaust it
    assert len(log.encode()) < 50_000 and log.count("Traceback") < 5, log[-3000:]
    assert "more like this suppressed" in log  # counted, not lost
    assert log.count("\n") < 100
