"""Clients that leave a chat stream after its first chunk, and the wait for an idle server."""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import urlsplit


def _get_json(url: str, path: str) -> Any:
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    try:
        connection.request("GET", path)
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def drop_streams_then_wait_idle(url: str, body: dict[str, Any], count: int) -> None:
    """``count`` streamed chat requests, each dropped after its first bytes; then assert
    every stage of every process reports ``running`` and ``waiting`` 0 within 30 s
    (a chunk that arrived after the abort used to start a run nobody ended)."""
    where = urlsplit(url)
    for _ in range(count):
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
        connection.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        assert response.status == 200, response.read()
        assert response.read1(256)
        connection.close()
    deadline = time.monotonic() + 30
    while True:
        health = _get_json(url, "/health")
        busy = {
            (name, stage): depth
            for name, info in health["processes"].items()
            for stage, depth in info["queue"].items()
            if any(depth.values())  # its own counts and its engine scheduler's
        }
        if not busy and health["inflight"] == 0:
            return
        assert time.monotonic() < deadline, (busy, health["inflight"])
        time.sleep(0.2)
