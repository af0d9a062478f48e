"""Clients that go away mid-stream leave nothing running: through ``omni serve`` itself.

Each client opens a streamed ``POST /v1/audio/speech``, reads the first chunk
and closes the connection. Every such request must be aborted in every stage:
afterwards ``/health`` reports no request in flight and every stage of every
process at ``running`` 0 and ``waiting`` 0 (a stream chunk arriving after the
abort used to start a vocoder run that never ended).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from serve_helpers import OmniServe, raw

pytest.importorskip("omni_qwen3_tts")

DEMO = Path(__file__).resolve().parents[2] / "examples" / "qwen3_tts_demo.toml"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServe]:
    served = OmniServe(tmp_path_factory.mktemp("disconnects"), DEMO)
    try:
        yield served
    finally:
        assert served.stop() == 0, served.stderr()


def read_one_chunk_and_leave(url: str, seed: int) -> int:
    """A streamed speech request dropped after its first body bytes; the status seen."""
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    body = {"input": "Hello there, how are you today?", "voice": "serena", "stream": True}
    body["seed"] = seed
    connection.request(
        "POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    status = response.status
    if status == 200:
        assert response.read1(4096)
    connection.close()  # gone, with the rest of the audio still coming
    return status


def idle(server: OmniServe, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = raw("GET", f"{server.url}/health").json()
        busy = {
            f"{name}.{stage}": depth
            for name, info in health["processes"].items()
            for stage, depth in info["queue"].items()
            if any(depth.values())  # its own counts and its engine scheduler's
        }
        if not busy and health["inflight"] == 0:
            return health
        if time.monotonic() > deadline:
            raise AssertionError(f"not idle after {timeout} s: {busy}, {health['inflight']}")
        time.sleep(0.2)


# 48: six waves of the pool's eight at once (an abort racing a chunk in flight, each
# wave); the thousand of the slow case run the same races longer
@pytest.mark.parametrize(
    "count", [pytest.param(48, id="48"), pytest.param(1000, id="1000", marks=pytest.mark.slow)]
)
def test_streams_dropped_after_the_first_chunk_leave_every_stage_idle(server, count):
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: read_one_chunk_and_leave(server.url, i), range(count)))
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= count // 2
    health = idle(server)
    assert all(info["restarts"] == 0 for info in health["processes"].values())
    # and the server still speaks
    reply = raw(
        "POST", f"{server.url}/v1/audio/speech", json_body={"input": "Hi.", "voice": "serena"}
    )
    assert reply.status_code == 200 and reply.content[:4] == b"RIFF"
