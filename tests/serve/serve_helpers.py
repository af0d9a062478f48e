"""Plain helpers of the server tests: raw HTTP (stdlib) and process trees (/proc)."""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Reply:
    def __init__(self, status: int, headers: Any, body: bytes):
        self.status_code, self.headers, self.content = status, headers, body

    @property
    def text(self) -> str:
        return self.content.decode()

    def json(self) -> Any:
        import json

        return json.loads(self.content)


def raw(
    method: str,
    url: str,
    *,
    json_body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Reply:
    """A plain HTTP request (stdlib), for what the openai client cannot send."""
    import json
    import urllib.error
    import urllib.request

    data = None if json_body is None else json.dumps(json_body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={**({"Content-Type": "application/json"} if data else {}), **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, error.headers, error.read())


def parse_wav(data: bytes) -> tuple[dict[str, int], bytes]:
    """The fmt fields and the data of a canonical PCM WAV, checked by hand."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE" and data[12:16] == b"fmt "
    size, fmt, channels, rate, byte_rate, block, bits = struct.unpack("<IHHIIHH", data[16:36])
    assert data[36:40] == b"data"
    (data_size,) = struct.unpack("<I", data[40:44])
    return {
        "riff_size": struct.unpack("<I", data[4:8])[0],
        "fmt_size": size,
        "format": fmt,
        "channels": channels,
        "rate": rate,
        "byte_rate": byte_rate,
        "block": block,
        "bits": bits,
        "data_size": data_size,
    }, data[44:]


def samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32767
