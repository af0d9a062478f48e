"""Plain helpers of the server tests: raw HTTP (stdlib), process trees (/proc), and
``omni serve`` as a subprocess."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
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


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it if the test process dies (Linux)."""
    with contextlib.suppress(OSError):  # not Linux: the teardown alone stops it
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


OMNI = (sys.executable, "-m", "omni_core")


def wait_ready(proc: subprocess.Popen, timeout: float, stderr: Any = lambda: "") -> None:
    """Wait for ``omni serve``'s "ready" line: it listens (and prints its address) at once,
    and says on stdout when every process is up (before that, requests get a 503)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
        line = proc.stdout.readline() if ready else ""
        if line.startswith("omni: ready"):
            return
        if not line:
            raise AssertionError(f"omni serve did not get ready in {timeout:g} s\n{stderr()}")


class OmniServe:
    """``omni serve DEPLOY --port 0 FLAGS``: up once it printed its address.

    ``command`` replaces ``python -m omni_core`` (a launcher that registers the
    test pipelines first; ``deploy`` may then be ``--pipeline NAME``'s words),
    and ``nofile`` caps the server's file descriptors; ``env`` adds to its environment.
    """

    def __init__(
        self,
        base: Path,
        deploy: Path | tuple[str, ...],
        flags: tuple[str, ...] = (),
        timeout: float = 60,
        *,
        command: tuple[str, ...] = OMNI,
        nofile: int | None = None,
        env: dict[str, str] | None = None,
    ):
        self.base = base
        self.log_path = base / "serve.err"
        self.log = self.log_path.open("w")
        target = (str(deploy),) if isinstance(deploy, Path) else deploy

        def before_exec() -> None:
            _die_with_parent()
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [
                *(*command, "serve", *target, "--port", "0"),
                *("--endpoints.base_path", str(base / "run")),
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            preexec_fn=before_exec,
            env=None if env is None else {**os.environ, **env},
        )
        self.children: set[int] = set()
        self.url = self._wait_for_address(timeout=timeout)
        self.children = descendants(self.proc.pid)

    def _wait_for_address(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if " on http" not in line:  # "omni: serving qwen3-tts on http://127.0.0.1:PORT (…)"
            self.stop()
            raise AssertionError(f"omni serve did not start: {line!r}\n{self.stderr()}")
        url = line.split(" on ")[1].split()[0]
        wait_ready(self.proc, timeout, self.stderr)
        return url

    def stderr(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def client(self) -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL for whatever of the tree is left; the exit status."""
        self.children |= descendants(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        deadline = time.monotonic() + 5
        while any(alive(p) for p in self.children) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in self.children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.log.close()
        return self.proc.returncode
