"""Soak: two real ``omni serve`` processes under 100 mixed clients for 10 minutes.

Run: ``.venv/bin/python benchmarks/soak.py [--clients 100] [--minutes 10] [--kill-at S]``
(``--minutes`` takes fractions: ``--minutes 0.5``; ``--smoke``: 4 clients for 3 s,
no stage kill, to check that the script still runs). It prints figures and a
PASS/FAIL verdict; it is not a test. Exit status 0 when every check passes,
1 otherwise, 130 when interrupted.

What runs: ``omni serve`` as child processes, each bound to 127.0.0.1 on a
free port (``--port 0``; the URL is read from its start-up line), in a
session of its own so that the whole process tree can be stopped (SIGTERM
to the server, then SIGKILL to whatever is left of its process group,
whatever happens here, Ctrl-C included; the servers also get SIGTERM if
this script dies):

* speech: ``examples/qwen3_tts_demo.toml`` with ``--server.voices_dir``
  (a private 0700 temporary directory). The shipped demo is a CustomVoice
  checkpoint (named speakers, no cloning: an upload is refused with a 400),
  so by default (``--tts-model base``) the tiny preset's files are copied to
  a temporary directory as a *Base* checkpoint (``tts_model_type = "base"``,
  as the plugin's tests do) and served with ``--model-path``: uploads then
  enroll for real, and every speech request speaks in a voice uploaded at
  start. ``--tts-model demo`` serves the demo as shipped: voices are only
  listed, uploads are refused (counted as expected 4xx), speech uses the
  built-in speakers;
* chat: ``examples/qwen3_omni_text_demo.toml``.

Both get ``--runtime.max_inflight`` (``--speech-max-inflight``,
``--chat-max-inflight``: more than the engines run at once, so requests
queue inside the server and a 429 means truly over the limit) and
``--runtime.request_timeout``.

The clients (asyncio: aiohttp for HTTP, ``websockets`` for the WebSocket;
without ``websockets`` the WebSocket kinds are skipped, saying so) each loop
until the time is up, picking a request kind at random (weights in
``KINDS``), with a short pause between requests (a 429 waits its
Retry-After): speech as a whole wav, streamed raw audio, speech SSE,
WebSocket sessions on ``/v1/audio/speech/stream``, chat with a small PNG
and/or a WAV clip (data URL / ``input_audio``, generated here with numpy,
Pillow and soundfile), streamed or not, voices list / upload / delete, and
deliberate disconnects (a speech stream, a chat stream or a WebSocket closed
or aborted right after its first audio or chunk). Each request's outcome is
its status class: 2xx, 4xx, 429, 503, other 5xx, or ``err`` (a connection
error, a timeout, a stream cut short); an error that arrives inside a stream
(an SSE or WebSocket ``error`` event) counts as its status.

``--kill-at S`` (default: the middle of the run; ``off`` for none) SIGKILLs
the speech server's stage process once; requests whose lifetime overlaps
the window from the kill to 3 s after ``/health`` shows it healthy again
are counted apart, where 503s (and cut streams) are expected.

Every ``--report-every`` seconds (60) and at the end it prints, per request
kind, count / 2xx / 4xx / 429 / 503 / 5xx / err and the p50 / p95 latency of
the successful ones (whole requests and streams: to the last byte;
disconnects: to the first audio), and per server: RSS of the server and its
children (sum and max), open descriptors (``/proc/PID/fd``) of the server
and of its children, in-flight requests and each stage's running/waiting
from ``/health``. After the clients stop (and their connections close) it
waits up to 30 s for the servers to settle, then checks:

* no 5xx but 503s inside the kill window, no connection errors outside it,
  no 4xx but the expected refusals;
* the killed process came back (restarts + 1, healthy);
* ``/health`` back to zero: inflight 0, every stage running 0 and waiting 0;
* RSS and descriptor counts flat after warm-up: the value at the end of
  minute 1 (at 20% of the run for runs under 5 minutes) against the end;
  growth over 15% + 50 MB (RSS) or 20 descriptors is a FAIL;
* the voices directory holds only the voice uploaded at start (no
  leftover uploads, temporary or trash entries);
* each server stops on SIGTERM within its grace period, exit status 0,
  its runtime directory removed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import contextvars
import ctypes
import io
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SPEECH_DEMO = REPO / "examples" / "qwen3_tts_demo.toml"
CHAT_DEMO = REPO / "examples" / "qwen3_omni_text_demo.toml"
TINY_TTS = REPO / "plugins" / "qwen3_tts" / "omni_qwen3_tts" / "presets" / "tiny"
OMNI = Path(sys.executable).with_name("omni")
OMNI_ARGV = [str(OMNI)] if OMNI.exists() else [sys.executable, "-m", "omni_core"]
SERVING_LINE = re.compile(r"omni: serving \S+ on (http://[0-9.]+:\d+) ")
CLASSES = ("2xx", "4xx", "429", "503", "5xx", "err")
# Error "type"s of the server's JSON errors (omni_core/serve/common/errors.py), for errors that
# arrive inside a stream, where there is no status line: SSE error events carry only these.
TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "not_found_error": 404,
    "rate_limit_error": 429,
    "server_error": 500,
    "service_unavailable": 503,
    "timeout_error": 504,
}
# kind: (server, weight). A client picks one per request.
KINDS: dict[str, tuple[str, int]] = {
    "speech_wav": ("speech", 3),
    "speech_stream": ("speech", 2),
    "speech_sse": ("speech", 2),
    "ws_speech": ("speech", 2),
    "drop_stream": ("speech", 1),
    "drop_ws": ("speech", 1),
    "voices_list": ("speech", 1),
    "voice_upload": ("speech", 1),  # upload, then (when it was stored) delete it
    "chat_media": ("chat", 3),
    "chat_stream": ("chat", 1),
    "drop_chat": ("chat", 1),
}
# Recorded kinds that are not picked themselves (voice_delete follows a stored upload).
EXTRA_KINDS = {"voice_delete": "speech"}
SENTENCES = [
    "Hello there, how are you today?",
    "The weather is mild with a light breeze.",
    "Please remember to water the plants.",
    "Our train leaves at half past nine.",
    "This is a short test of the speech server.",
    "Numbers like 3.14 and 42 are read aloud.",
    "A quick brown fox jumps over the lazy dog.",
    "Thank you for calling, goodbye!",
]
SETUP_VOICE = "soak"
SETTLE_SECONDS = 30.0
DRAIN_SECONDS = 60.0
GRACE_SECONDS = 30.0
KILL_TAIL = 3.0  # seconds after recovery still inside the kill window
# The running request's first audio / chunk (time.monotonic()), set by the stream kinds.
_FIRST: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("first")


def first_chunk() -> None:
    with contextlib.suppress(LookupError):
        _FIRST.get().setdefault("at", time.monotonic())


# -- processes ---------------------------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """SIGTERM the server if this script dies (prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


HELD_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT held back until the block ends, then raised again.

    Why: this script turns them into an exception (``omni_core.sigterm``) that may
    land anywhere; inside ``subprocess.Popen``, after the fork, it would leave a
    started server that no ``Server.proc`` names, which nothing stops and which
    writes into a work directory already removed (the GPU check's SIGTERM test
    caught a directory left behind under load). Held by the handlers, not the
    signal mask: a process-wide signal goes to whichever thread does not block it,
    and the main thread runs the handler all the same. A child's handlers are the
    defaults again once it execs. Outside the main thread (where no handler can be
    set) nothing is held.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    heard: list[int] = []
    previous = {
        number: signal.signal(number, lambda signum, frame: heard.append(signum))
        for number in HELD_SIGNALS
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in heard:
            signal.raise_signal(number)


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants, from ``/proc/*/stat``."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children[ppid].append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Snapshot:
    at: float  # seconds into the run
    rss_sum: float
    rss_max: float
    procs: int
    fds_parent: int
    fds_children: int
    health: dict[str, Any] | None

    def describe(self) -> str:
        return (
            f"rss sum {self.rss_sum:.0f} MB max {self.rss_max:.0f} MB ({self.procs} procs); "
            f"fds parent {self.fds_parent} children {self.fds_children}; "
            f"{describe_health(self.health)}"
        )


def describe_health(health: dict[str, Any] | None) -> str:
    if not health:
        return "health: no answer"
    parts = [
        f"{health.get('status')}; inflight {health.get('inflight')}/{health.get('max_inflight')}"
    ]
    for name, proc in (health.get("processes") or {}).items():
        queue = proc.get("queue") or {}
        stages = " ".join(
            f"{stage} {q.get('running', '?')}/{q.get('waiting', '?')}" for stage, q in queue.items()
        )
        parts.append(
            f"{name} {proc.get('state')} restarts {proc.get('restarts')}"
            + (f": {stages} (running/waiting)" if stages else "")
        )
    return "; ".join(parts)


def health_counters_zero(health: dict[str, Any] | None) -> tuple[bool, str]:
    if not health:
        return False, "no /health answer"
    bad = []
    if health.get("inflight") != 0:
        bad.append(f"inflight {health.get('inflight')}")
    for name, proc in (health.get("processes") or {}).items():
        if proc.get("state") != "healthy":
            bad.append(f"{name} {proc.get('state')}")
        for stage, q in (proc.get("queue") or {}).items():
            if q.get("running") or q.get("waiting"):
                bad.append(f"{stage} running {q.get('running')} waiting {q.get('waiting')}")
    return not bad, ", ".join(bad) or "inflight 0, every stage running 0 waiting 0"


class Server:
    """One ``omni serve`` child: started in a session of its own, stopped with its tree."""

    def __init__(self, name: str, deploy: Path, flags: list[str], workdir: Path):
        self.name, self.deploy, self.flags = name, deploy, flags
        self.log_path = workdir / f"{name}.log"
        self.runtime_base = workdir / f"rt-{name}"
        self.runtime_base.mkdir(mode=0o700)
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.exit_status: int | None = None
        self.stop_seconds: float | None = None
        self.killed_left: list[int] = []

    def start(self) -> None:
        argv = [
            *OMNI_ARGV,
            "serve",
            str(self.deploy),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--endpoints.base_path",
            str(self.runtime_base),
            *self.flags,
        ]
        with open(self.log_path, "wb") as log, signals_held():
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                cwd=REPO,
            )

    def wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} server exited ({self.proc.returncode}) while starting:\n"
                    + self.log_tail()
                )
            found = SERVING_LINE.search(self.log_path.read_text(errors="replace"))
            if found:
                self.url = found.group(1)
                health = fetch_json(self.url + "/health")
                if health and health.get("status") == "healthy":
                    return
            time.sleep(0.3)
        raise RuntimeError(f"{self.name} server not ready in {timeout:g} s:\n" + self.log_tail())

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + line for line in text[-lines:])

    def tree(self) -> list[int]:
        return process_tree(self.proc.pid) if self.proc and self.proc.poll() is None else []

    def stage_children(self) -> list[int]:
        """The runtime's stage processes (multiprocessing spawn children, not its tracker)."""
        if not self.proc:
            return []
        return [
            pid
            for pid in self.tree()[1:]
            if "spawn_main" in cmdline(pid) and "resource_tracker" not in cmdline(pid)
        ]

    def measure(self, at: float, health: dict[str, Any] | None) -> Snapshot:
        pids = self.tree()
        rss = [rss_mb(pid) for pid in pids]
        return Snapshot(
            at,
            sum(rss),
            max(rss, default=0.0),
            len(pids),
            fd_count(pids[0]) if pids else 0,
            sum(fd_count(pid) for pid in pids[1:]),
            health,
        )

    def stop(self) -> None:
        """SIGTERM the server (it stops its children), then SIGKILL what is left of the tree."""
        proc = self.proc
        if proc is None:
            return
        tree = self.tree()
        started = time.monotonic()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=GRACE_SECONDS)
                self.stop_seconds = time.monotonic() - started
            except subprocess.TimeoutExpired:
                pass
        left = [pid for pid in tree if os.path.exists(f"/proc/{pid}")]
        self.killed_left = left
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its session's group: start_new_session
        self.exit_status = proc.wait()

    def runtime_dirs_left(self) -> list[str]:
        if not self.runtime_base.is_dir():
            return []
        return sorted(p.name for p in self.runtime_base.iterdir())


def fetch_json(url: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """GET ``url`` (urllib; 503 answers too, /health says why in JSON)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(Exception):
            return json.loads(exc.read())
    except Exception:
        pass
    return None


# -- media -------------------------------------------------------------------------------


def wav_bytes(seconds: float, rate: int, hz: float, seed: int) -> bytes:
    import numpy as np
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.shape[0])
    wave = 0.3 * np.sin(2 * np.pi * hz * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    out = io.BytesIO()
    soundfile.write(
        out, (wave + 0.02 * noise).astype(np.float32), rate, format="WAV", subtype="PCM_16"
    )
    return out.getvalue()


def png_bytes(size: int, seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    gradient = np.linspace(0, 255, size, dtype=np.float32)
    pixels = np.stack(
        [
            np.add.outer(gradient, gradient) / 2,
            rng.random((size, size)) * 255,
            np.tile(gradient, (size, 1)),
        ],
        axis=-1,
    ).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@dataclass
class Media:
    images: list[str]  # data URLs
    clips: list[str]  # base64 wav (input_audio)
    uploads: list[bytes]  # wav files for voice uploads (1.2-3 s, 24 kHz)

    @classmethod
    def make(cls) -> Media:
        images = [
            "data:image/png;base64," + base64.b64encode(png_bytes(size, i)).decode()
            for i, size in enumerate((32, 48, 64, 96))
        ]
        clips = [
            base64.b64encode(wav_bytes(seconds, 16000, hz, i)).decode()
            for i, (seconds, hz) in enumerate(((0.5, 220), (1.0, 330), (1.5, 440), (2.0, 180)))
        ]
        uploads = [
            wav_bytes(seconds, 24000, hz, 10 + i)
            for i, (seconds, hz) in enumerate(((1.2, 150), (2.0, 180), (3.0, 240)))
        ]
        return cls(images, clips, uploads)


# -- outcomes ----------------------------------------------------------------------------


@dataclass
class Result:
    kind: str
    server: str
    start: float  # seconds into the run
    end: float
    status: int | None  # None: a connection error, a timeout, a stream cut short
    note: str = ""
    first: float | None = None  # seconds into the run of the first audio / chunk (streams)

    @property
    def cls(self) -> str:
        return status_class(self.status)

    @property
    def latency(self) -> float:
        return self.end - self.start


def status_class(status: int | None) -> str:
    if status is None:
        return "err"
    if status == 429:
        return "429"
    if status == 503:
        return "503"
    if 200 <= status < 300:
        return "2xx"
    if 400 <= status < 500:
        return "4xx"
    if status >= 500:
        return "5xx"
    return "err"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def table(results: list[Result], kinds: list[str], indent: str = "  ") -> list[str]:
    head = (
        f"{indent}{'kind':<14}{'count':>7}{'2xx':>7}{'4xx':>6}{'429':>7}{'503':>6}{'5xx':>6}"
        f"{'err':>6}{'p50 s':>8}{'p95 s':>8}"
    )
    rows = [head]
    by_kind: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        by_kind[result.kind].append(result)
    for kind in [*kinds, "all"]:
        group = results if kind == "all" else by_kind.get(kind, [])
        if kind != "all" and not group:
            rows.append(f"{indent}{kind:<14}{0:>7}")
            continue
        counts = {c: 0 for c in CLASSES}
        for result in group:
            counts[result.cls] += 1
        ok = [r.latency for r in group if r.cls == "2xx"]
        p50, p95 = percentile(ok, 0.5), percentile(ok, 0.95)
        rows.append(
            f"{indent}{kind:<14}{len(group):>7}{counts['2xx']:>7}{counts['4xx']:>6}"
            f"{counts['429']:>7}{counts['503']:>6}{counts['5xx']:>6}{counts['err']:>6}"
            f"{_secs(p50):>8}{_secs(p95):>8}"
        )
    return rows


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


# -- the clients -------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace, servers: dict[str, Server], media: Media):
        self.args = args
        self.servers = servers
        self.media = media
        self.duration = args.minutes * 60.0
        self.t0 = 0.0
        self.results: list[Result] = []
        self.samples: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.expected_4xx: set[str] = set()
        self.stopping = False
        self.kill: dict[str, Any] = {}
        self.snapshots: dict[str, list[Snapshot]] = defaultdict(list)
        self.baseline: dict[str, Snapshot] = {}
        self.cancelled = 0
        self.kinds = dict(KINDS)
        self.notes: list[str] = []
        try:
            import websockets.asyncio.client  # noqa: F401

            self.ws = True
        except ImportError:
            self.ws = False
            for kind in ("ws_speech", "drop_ws"):
                self.kinds.pop(kind)
            self.notes.append("websockets is not installed: the WebSocket kinds are skipped")
        self.base_voices = args.tts_model == "base"
        if self.base_voices:
            self.voices = [SETUP_VOICE]
            self.notes.append(
                "voices: the tiny preset served as a Base checkpoint (tts_model_type = base, "
                "--model-path); uploads enroll for real, speech speaks the voice uploaded at "
                "start; the demo as shipped (CustomVoice) cannot clone (--tts-model demo)"
            )
        else:
            self.voices = ["serena", "ryan", "eric"]
            self.expected_4xx.add("voice_upload")
            self.notes.append(
                "voices: the demo as shipped is CustomVoice and cannot clone; only list and a "
                "refused upload (its 400s are expected) are exercised"
            )
        self.upload_seq = 0
        self.checks: list[tuple[bool, str, str]] = []
        self.final: dict[str, Snapshot] = {}
        self.settled_at: float | None = None
        self.last_shown, self.last_tick = 0, 0.0

    # -- helpers ------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(
        self,
        kind: str,
        start: float,
        status: int | None,
        note: str = "",
        first: float | None = None,
    ) -> None:
        server = self.kinds[kind][0] if kind in self.kinds else EXTRA_KINDS[kind]
        first = None if first is None else first - self.t0
        result = Result(kind, server, start, self.now(), status, note, first)
        self.results.append(result)
        if result.cls != "2xx" and note:
            seen = self.samples[(kind, result.cls)]
            if len(seen) < 3 and note not in seen:
                seen.append(note)

    def speech_body(self, rng: random.Random, **extra: Any) -> dict[str, Any]:
        text = " ".join(rng.sample(SENTENCES, rng.randint(1, 2)))
        return {
            "input": text,
            "voice": rng.choice(self.voices),
            "max_frames": rng.randint(8, 32),
            "seed": rng.randint(0, 2**31),
            **extra,
        }

    def chat_body(self, rng: random.Random, stream: bool) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        which = rng.choice(("image", "audio", "both"))
        if which in ("image", "both"):
            parts.append({"type": "image_url", "image_url": {"url": rng.choice(self.media.images)}})
        if which in ("audio", "both"):
            clip = rng.choice(self.media.clips)
            parts.append({"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}})
        parts.append({"type": "text", "text": rng.choice(("What is this?", "Describe it.", "Hi"))})
        return {
            "messages": [{"role": "user", "content": parts}],
            "max_tokens": rng.randint(4, 24),
            "seed": rng.randint(0, 2**31),
            "stream": stream,
        }

    @staticmethod
    def error_note(data: bytes) -> str:
        try:
            error = json.loads(data)["error"]
            return str(error.get("message", error))[:160]
        except Exception:
            return data[:160].decode(errors="replace")

    # -- the request kinds (each returns (status, note)) ------------------------------------

    async def speech_wav(self, http, rng) -> tuple[int | None, str]:
        url = self.servers["speech"].url + "/v1/audio/speech"
        async with http.post(url, json=self.speech_body(rng, response_format="wav")) as r:
            data = await r.read()
            if r.status != 200:
                return r.status, self.error_note(data)
            if not data.startswith(b"RIFF"):
                return None, f"not a wav body ({len(data)} bytes)"
            return r.status, ""

    async def speech_stream(self, http, rng) -> tuple[int | None, str]:
        url = self.servers["speech"].url + "/v1/audio/speech"
        body = self.speech_body(rng, stream=True, response_format=rng.choice(("pcm", "wav")))
        async with http.post(url, json=body) as r:
            if r.status != 200:
                return r.status, self.error_note(await r.read())
            size = 0
            async for chunk in r.content.iter_any():
                first_chunk()
                size += len(chunk)
            return (r.status, "") if size else (None, "empty stream")

    async def speech_sse(self, http, rng) -> tuple[int | None, str]:
        url = self.servers["speech"].url + "/v1/audio/speech"
        body = self.speech_body(rng, stream_format="sse", response_format="pcm")
        async with http.post(url, json=body) as r:
            if r.status != 200:
                return r.status, self.error_note(await r.read())
            async for event in sse_events(r):
                kind = event.get("type")
                if kind == "speech.audio.done":
                    return r.status, ""
                if kind == "error":
                    error = event.get("error") or {}
                    status = TYPE_STATUS.get(error.get("type"), 500)
                    return status, "in-stream error: " + str(error.get("message"))[:140]
            return None, "SSE ended without speech.audio.done"

    async def chat_media(self, http, rng) -> tuple[int | None, str]:
        url = self.servers["chat"].url + "/v1/chat/completions"
        async with http.post(url, json=self.chat_body(rng, stream=False)) as r:
            data = await r.read()
            if r.status != 200:
                return r.status, self.error_note(data)
            try:
                reply = json.loads(data)
                reply["choices"][0]["message"]
            except Exception:
                return None, "not a chat completion: " + data[:100].decode(errors="replace")
            return r.status, ""

    async def chat_stream(self, http, rng) -> tuple[int | None, str]:
        url = self.servers["chat"].url + "/v1/chat/completions"
        async with http.post(url, json=self.chat_body(rng, stream=True)) as r:
            if r.status != 200:
                return r.status, self.error_note(await r.read())
            async for event in sse_events(r):
                if event.get("done"):
                    return r.status, ""
                if "error" in event:
                    error = event["error"] or {}
                    status = TYPE_STATUS.get(error.get("type"), 500)
                    return status, "in-stream error: " + str(error.get("message"))[:140]
            return None, "chat stream ended without [DONE]"

    async def drop_stream(self, http, rng) -> tuple[int | None, str]:
        """A speech stream, closed (the socket) right after its first chunk."""
        url = self.servers["speech"].url + "/v1/audio/speech"
        body = self.speech_body(rng, stream=True, response_format="pcm")
        body["max_frames"] = rng.randint(40, 120)  # still speaking when the client leaves
        async with http.post(url, json=body) as r:
            if r.status != 200:
                return r.status, self.error_note(await r.read())
            chunk = await r.content.readany()
            first_chunk()
            r.close()  # closes the connection, not back to the pool
            return (r.status, "") if chunk else (None, "no first chunk")

    async def drop_chat(self, http, rng) -> tuple[int | None, str]:
        url = self.servers["chat"].url + "/v1/chat/completions"
        body = self.chat_body(rng, stream=True)
        body["max_tokens"] = rng.randint(32, 96)
        async with http.post(url, json=body) as r:
            if r.status != 200:
                return r.status, self.error_note(await r.read())
            chunk = await r.content.readany()
            first_chunk()
            r.close()
            return (r.status, "") if chunk else (None, "no first chunk")

    async def voices_list(self, http, rng) -> tuple[int | None, str]:
        async with http.get(self.servers["speech"].url + "/v1/audio/voices") as r:
            data = await r.read()
            if r.status != 200:
                return r.status, self.error_note(data)
            names = {v.get("name") for v in json.loads(data).get("data", [])}
            if self.base_voices and SETUP_VOICE not in names:
                return None, f"the setup voice is not listed: {sorted(names)}"
            return r.status, ""

    async def voice_upload(self, http, rng, client: int) -> tuple[int | None, str]:
        """Upload a voice; when stored, delete it (recorded as voice_delete)."""
        import aiohttp

        self.upload_seq += 1
        name = f"soak-c{client}-{self.upload_seq}"
        status, note = await upload_voice(
            http, self.servers["speech"].url, name, rng.choice(self.media.uploads), aiohttp
        )
        if status == 201:
            start = self.now()
            try:
                async with http.delete(f"{self.servers['speech'].url}/v1/audio/voices/{name}") as r:
                    data = await r.read()
                    self.record(
                        "voice_delete",
                        start,
                        r.status,
                        "" if r.status == 200 else self.error_note(data),
                    )
            except (Exception, asyncio.TimeoutError) as exc:
                self.record("voice_delete", start, None, describe_exc(exc))
        return status, note

    async def ws_speech(self, http, rng, drop: bool = False) -> tuple[int | None, str]:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidStatus

        url = self.servers["speech"].url.replace("http://", "ws://", 1) + "/v1/audio/speech/stream"
        body = self.speech_body(rng)
        config = {
            "type": "session.config",
            "voice": body["voice"],
            "max_frames": rng.randint(40, 120) if drop else body["max_frames"],
            "seed": body["seed"],
        }
        text = " ".join(rng.sample(SENTENCES, rng.randint(2, 3)))
        pieces = [text[i : i + 24] for i in range(0, len(text), 24)]
        errors: list[tuple[int, str]] = []
        try:
            ws = await connect(url, open_timeout=15, close_timeout=5, max_size=2**24)
        except InvalidStatus as exc:
            return exc.response.status_code, "handshake refused"
        try:
            await ws.send(json.dumps(config))
            for piece in pieces:
                await ws.send(json.dumps({"type": "input.text", "text": piece}))
                await asyncio.sleep(rng.uniform(0.0, 0.05))
            await ws.send(json.dumps({"type": "input.done"}))
            done = False
            async for message in ws:
                if isinstance(message, bytes):
                    first_chunk()
                    if drop:
                        if rng.random() < 0.5:
                            ws.transport.abort()  # gone without a close frame
                        else:
                            await ws.close()
                        return 200, ""
                    continue
                event = json.loads(message)
                if event.get("type") == "error":
                    errors.append(
                        (int(event.get("status") or 500), str(event.get("message"))[:140])
                    )
                elif event.get("type") == "session.done":
                    done = True
            if errors:
                status, message = max(errors)
                return status, "error event: " + message
            if drop:
                return None, "session ended before any audio"
            if not done:
                return None, f"closed without session.done ({ws.close_code})"
            return 200, ""
        except ConnectionClosed as exc:
            if errors:
                status, message = max(errors)
                return status, "error event: " + message
            code = exc.rcvd.code if exc.rcvd else None
            return (500 if code == 1011 else None), f"websocket closed: {code}"
        finally:
            with contextlib.suppress(Exception):
                ws.transport.abort() if drop else await ws.close()

    async def drop_ws(self, http, rng) -> tuple[int | None, str]:
        return await self.ws_speech(http, rng, drop=True)

    # -- the loop ----------------------------------------------------------------------

    async def client(self, index: int, http: Any) -> None:
        rng = random.Random(self.args.seed * 100003 + index)
        names = list(self.kinds)
        weights = [self.kinds[k][1] for k in names]
        await asyncio.sleep(rng.uniform(0, 2.0))  # no thundering herd at t=0
        while not self.stopping:
            kind = rng.choices(names, weights)[0]
            mark: dict[str, float] = {}
            _FIRST.set(mark)
            start = self.now()
            try:
                if kind == "voice_upload":
                    call = self.voice_upload(http, rng, index)
                else:
                    call = getattr(self, kind)(http, rng)
                status, note = await asyncio.wait_for(call, self.args.request_timeout)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            except (Exception, asyncio.TimeoutError) as exc:
                status, note = None, describe_exc(exc)
            self.record(kind, start, status, note, mark.get("at"))
            if status in (429, 503):
                await asyncio.sleep(1.0 + rng.uniform(0, 0.5))  # their Retry-After: 1
            else:
                await asyncio.sleep(rng.uniform(0.05, 0.5))

    # -- the kill --------------------------------------------------------------------------

    async def kill_stage(self, http: Any, at: float) -> None:
        await asyncio.sleep(max(0.0, at - self.now()))
        if self.stopping:
            return
        server = self.servers["speech"]
        before = await get_health(http, server.url)
        restarts = sum(p.get("restarts", 0) for p in (before or {}).get("processes", {}).values())
        stages = server.stage_children()
        if not stages:
            self.kill = {"error": "no stage process found"}
            print(f"[{_clock(self.now())}] kill: no stage process found under the speech server")
            return
        pid = random.Random(self.args.seed).choice(stages)
        os.kill(pid, signal.SIGKILL)
        killed = self.now()
        self.kill = {"pid": pid, "at": killed, "recovered": None}
        print(
            f"[{_clock(killed)}] kill: SIGKILL stage process {pid} of the speech server", flush=True
        )
        deadline = killed + 180.0
        while self.now() < deadline:
            await asyncio.sleep(0.25)
            health = await get_health(http, server.url)
            if not health:
                continue
            procs = health.get("processes", {}).values()
            now_restarts = sum(p.get("restarts", 0) for p in procs)
            if now_restarts > restarts and all(p.get("state") == "healthy" for p in procs):
                self.kill["recovered"] = self.now()
                print(
                    f"[{_clock(self.now())}] kill: the speech server is healthy again after "
                    f"{self.now() - killed:.1f} s (restarts {restarts} -> {now_restarts})",
                    flush=True,
                )
                return
        self.kill["gave_up"] = True
        print(f"[{_clock(self.now())}] kill: no recovery within 180 s", flush=True)

    def restarting(self) -> bool:
        """Between the kill and KILL_TAIL after the recovery (False if none came in 180 s)."""
        if "at" not in self.kill or self.kill.get("gave_up"):
            return False
        recovered = self.kill.get("recovered")
        return recovered is None or self.now() < recovered + KILL_TAIL

    def kill_window(self) -> tuple[float, float] | None:
        if "at" not in self.kill:
            return None
        recovered = self.kill.get("recovered")
        end = (recovered + KILL_TAIL) if recovered is not None else float("inf")
        return self.kill["at"], end

    def in_kill_window(self, result: Result) -> bool:
        window = self.kill_window()
        return (
            window is not None
            and result.server == "speech"
            and result.start <= window[1]
            and result.end >= window[0]
        )

    # -- reporting -------------------------------------------------------------------------

    async def snapshot(self, http: Any) -> dict[str, Snapshot]:
        out = {}
        for name, server in self.servers.items():
            health = await get_health(http, server.url)
            out[name] = server.measure(self.now(), health)
            self.snapshots[name].append(out[name])
        return out

    def print_block(self, title: str, results: list[Result], snaps: dict[str, Snapshot]) -> None:
        print(f"\n{title}", flush=False)
        for line in table(results, self.all_kinds()):
            print(line)
        for name, snap in snaps.items():
            print(f"  server {name:<6} {snap.describe()}")
        sys.stdout.flush()

    def all_kinds(self) -> list[str]:
        kinds = list(self.kinds)
        if self.base_voices:
            kinds.insert(kinds.index("voice_upload") + 1, "voice_delete")
        return kinds

    async def reporter(self, http: Any) -> None:
        every = self.args.report_every
        warm_at = 60.0 if self.duration >= 300 else 0.2 * self.duration
        ticks = sorted({*(every * k for k in range(1, int(self.duration // every) + 1)), warm_at})
        ticks = [t for t in ticks if t < self.duration - 1.0 or t == warm_at]
        for tick in ticks:
            await asyncio.sleep(max(0.0, tick - self.now()))
            snaps = await self.snapshot(http)
            if tick == warm_at:
                # Not while the killed process restarts: its RSS and fds would be missing.
                waited = False
                while self.restarting() and not self.stopping:
                    waited = True
                    await asyncio.sleep(0.5)
                self.baseline = await self.snapshot(http) if waited else snaps
                print(
                    f"[{_clock(self.now())}] warm-up baseline: "
                    + "; ".join(
                        f"{n} rss {s.rss_sum:.0f} MB, fds {s.fds_parent}+{s.fds_children}"
                        for n, s in self.baseline.items()
                    ),
                    flush=True,
                )
            if tick % every == 0 and tick > 0:
                batch = self.results[self.last_shown :]
                self.last_shown = len(self.results)
                self.print_block(
                    f"[{_clock(self.now())}] {'minute' if every == 60 else 'report'} "
                    f"{round(tick / every)}: requests finished "
                    f"{_clock(self.last_tick)}-{_clock(tick)}",
                    batch,
                    snaps,
                )
                self.last_tick = tick

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> int:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.args.request_timeout, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, read_bufsize=2**20
        ) as http:
            if self.base_voices:
                status, note = await upload_voice(
                    http, self.servers["speech"].url, SETUP_VOICE, self.media.uploads[1], aiohttp
                )
                if status != 201:
                    print(f"setup: uploading voice {SETUP_VOICE!r} failed: {status} {note}")
                    return 1
            self.t0 = time.monotonic()
            tasks = [asyncio.create_task(self.client(i, http)) for i in range(self.args.clients)]
            reporter = asyncio.create_task(self.reporter(http))
            killer = None
            if self.args.kill_at is not None and self.args.kill_at < self.duration:
                killer = asyncio.create_task(self.kill_stage(http, self.args.kill_at))
            await asyncio.sleep(max(0.0, self.duration - self.now()))
            self.stopping = True
            ended = self.now()
            print(
                f"\n[{_clock(ended)}] time is up: waiting for the clients' last requests",
                flush=True,
            )
            _, pending = await asyncio.wait(tasks, timeout=DRAIN_SECONDS)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in (reporter, killer):
                if task is not None and not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            print(
                f"[{_clock(self.now())}] clients stopped "
                f"({len(pending)} cancelled after {DRAIN_SECONDS:g} s)",
                flush=True,
            )
        # The clients' connections are closed now: settle.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            settled_at = None
            deadline = self.now() + SETTLE_SECONDS
            while self.now() < deadline:
                healths = [await get_health(http, s.url) for s in self.servers.values()]
                if all(health_counters_zero(h)[0] for h in healths):
                    settled_at = self.now()
                    break
                await asyncio.sleep(1.0)
            await asyncio.sleep(1.0)  # closed sockets reach the server's fd table
            final = await self.snapshot(http)
            if not self.baseline:
                self.baseline = final
        self.final = final
        self.settled_at = settled_at
        return 0


async def upload_voice(http, url: str, name: str, audio: bytes, aiohttp) -> tuple[int | None, str]:
    form = aiohttp.FormData()
    form.add_field("name", name)
    form.add_field("consent", "true")
    form.add_field("transcript", "A humming tone.")
    form.add_field("file", audio, filename="voice.wav", content_type="audio/wav")
    async with http.post(url + "/v1/audio/voices", data=form) as r:
        data = await r.read()
        return r.status, ("" if r.status == 201 else Soak.error_note(data))


async def get_health(http, url: str) -> dict[str, Any] | None:
    try:
        async with http.get(url + "/health") as r:  # 503 with the same JSON when unhealthy
            return json.loads(await r.read())
    except Exception:
        return None


async def sse_events(response) -> Any:
    """The JSON events of a ``text/event-stream`` body (``[DONE]`` as ``{"done": True}``)."""
    buffer = b""
    async for chunk in response.content.iter_any():
        first_chunk()
        buffer += chunk
        while b"\n\n" in buffer:
            raw, buffer = buffer.split(b"\n\n", 1)
            for line in raw.splitlines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    yield {"done": True}
                else:
                    yield json.loads(payload)


def describe_exc(exc: BaseException) -> str:
    text = str(exc) or ""
    return f"{type(exc).__name__}: {text}"[:160]


# -- checks and the report ---------------------------------------------------------------------


def verdicts(soak: Soak, servers: dict[str, Server]) -> list[tuple[bool, str, str]]:
    checks: list[tuple[bool, str, str]] = []
    results = soak.results
    inside = [r for r in results if soak.in_kill_window(r)]
    outside = [r for r in results if not soak.in_kill_window(r)]
    bad_5xx = [r for r in results if r.cls == "5xx"] + [r for r in outside if r.cls == "503"]
    checks.append(
        (
            not bad_5xx,
            "5xx",
            f"{len(bad_5xx)} 5xx other than 503s inside the kill window" + _examples(bad_5xx),
        )
    )
    errors = [r for r in outside if r.cls == "err"]
    checks.append(
        (
            not errors,
            "errors",
            f"{len(errors)} connection errors outside the kill window" + _examples(errors),
        )
    )
    bad_4xx = [r for r in results if r.cls == "4xx" and r.kind not in soak.expected_4xx]
    expected = sum(1 for r in results if r.cls == "4xx" and r.kind in soak.expected_4xx)
    checks.append(
        (
            not bad_4xx,
            "4xx",
            f"{len(bad_4xx)} unexpected 4xx ({expected} expected refusals)" + _examples(bad_4xx),
        )
    )
    if soak.args.kill_at is not None and soak.args.kill_at < soak.duration:
        kill = soak.kill
        if kill.get("recovered") is not None:
            checks.append(
                (
                    True,
                    "recovery",
                    f"stage process {kill['pid']} killed at {kill['at']:.1f} s, healthy again "
                    f"after {kill['recovered'] - kill['at']:.1f} s; {len(inside)} requests in the "
                    f"window, {sum(r.cls == '503' for r in inside)} of them 503, "
                    f"{sum(r.cls == 'err' for r in inside)} cut",
                )
            )
        else:
            checks.append((False, "recovery", kill.get("error") or "no recovery seen"))
    for name in servers:
        ok, says = health_counters_zero(soak.final[name].health)
        settled = "" if soak.settled_at is None else f" (settled at {_clock(soak.settled_at)})"
        checks.append((ok, f"health {name}", says + settled))
    for name in servers:
        base, end = soak.baseline[name], soak.final[name]
        limit = base.rss_sum * 1.15 + 50
        checks.append(
            (
                end.rss_sum <= limit,
                f"rss {name}",
                f"{base.rss_sum:.0f} MB at {_clock(base.at)} -> {end.rss_sum:.0f} MB at the end "
                f"(limit {limit:.0f} MB; max process {base.rss_max:.0f} -> {end.rss_max:.0f} MB)",
            )
        )
        ok = end.fds_parent <= base.fds_parent + 20 and end.fds_children <= base.fds_children + 20
        checks.append(
            (
                ok,
                f"fds {name}",
                f"parent {base.fds_parent} -> {end.fds_parent}, children {base.fds_children} -> "
                f"{end.fds_children} (limit +20 each)",
            )
        )
    return checks


def _examples(results: list[Result]) -> str:
    if not results:
        return ""
    seen: dict[str, int] = defaultdict(int)
    for r in results:
        seen[f"{r.kind} {r.status} {r.note}".strip()] += 1
    shown = sorted(seen.items(), key=lambda kv: -kv[1])[:3]
    return "; e.g. " + " | ".join(f"{n}x {text}" for text, n in shown)


def voices_dir_check(soak: Soak, voices_dir: Path) -> tuple[bool, str, str]:
    entries = sorted(p.name for p in voices_dir.iterdir())
    want = [SETUP_VOICE] if soak.base_voices else []
    return (
        entries == want,
        "voices dir",
        f"entries {entries}" + ("" if entries == want else f", expected {want}"),
    )


def stop_checks(servers: dict[str, Server]) -> list[tuple[bool, str, str]]:
    checks = []
    for name, server in servers.items():
        left = server.runtime_dirs_left()
        ok = server.exit_status == 0 and server.stop_seconds is not None and not left
        checks.append(
            (
                ok,
                f"stop {name}",
                f"exit {server.exit_status} after "
                + ("SIGKILL" if server.stop_seconds is None else f"{server.stop_seconds:.1f} s")
                + (f", runtime dirs left: {left}" if left else ", runtime dir removed"),
            )
        )
    return checks


# -- main ----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients (100)")
    parser.add_argument("--minutes", type=float, default=10.0, help="run time, fractions too (10)")
    parser.add_argument(
        "--kill-at",
        default=None,
        help="seconds into the run to SIGKILL the speech server's stage process once "
        "(default: the middle; 'off' for none)",
    )
    parser.add_argument(
        "--tts-model",
        choices=("base", "demo"),
        default="base",
        help="base: the tiny preset as a Base checkpoint, so voice uploads enroll (default); "
        "demo: the demo as shipped (CustomVoice: uploads refused)",
    )
    parser.add_argument("--speech-max-inflight", type=int, default=64)
    parser.add_argument("--chat-max-inflight", type=int, default=32)
    parser.add_argument(
        "--server-request-timeout", type=float, default=120.0, help="runtime.request_timeout"
    )
    parser.add_argument(
        "--request-timeout", type=float, default=150.0, help="the clients' timeout per request"
    )
    parser.add_argument("--report-every", type=float, default=60.0, help="seconds (60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--results", type=Path, help="write every request's outcome here (JSON lines)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="4 clients for 3 s, no stage kill: checks the script runs (make test)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.minutes, args.kill_at = 4, 3 / 60, "off"
    if args.clients < 1 or args.minutes <= 0:
        parser.error("--clients must be >= 1 and --minutes > 0")
    if args.kill_at is None:
        args.kill_at = args.minutes * 30.0
    elif str(args.kill_at).lower() in ("off", "none", "no"):
        args.kill_at = None
    else:
        args.kill_at = float(args.kill_at)
    return args


def base_checkpoint(root: Path) -> Path:
    """The tiny preset's files as a Qwen3-TTS Base checkpoint (configs only: dummy weights)."""
    shutil.copytree(TINY_TTS, root)
    config = json.loads((root / "config.json").read_text())
    config["tts_model_type"] = "base"
    (root / "config.json").write_text(json.dumps(config))
    return root


def main() -> int:
    args = parse_args()
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        print("soak.py needs aiohttp (pip install -e '.[ray]' brings it)", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    workdir = Path(tempfile.mkdtemp(prefix="soak-", dir="/tmp" if os.path.isdir("/tmp") else None))
    voices_dir = workdir / "voices"
    voices_dir.mkdir(mode=0o700)
    speech_flags = [
        "--server.voices_dir",
        str(voices_dir),
        "--runtime.max_inflight",
        str(args.speech_max_inflight),
        "--runtime.request_timeout",
        str(args.server_request_timeout),
    ]
    if args.tts_model == "base":
        speech_flags += ["--model-path", str(base_checkpoint(workdir / "qwen3-tts-tiny-base"))]
    chat_flags = [
        "--runtime.max_inflight",
        str(args.chat_max_inflight),
        "--runtime.request_timeout",
        str(args.server_request_timeout),
    ]
    servers = {
        "speech": Server("speech", SPEECH_DEMO, speech_flags, workdir),
        "chat": Server("chat", CHAT_DEMO, chat_flags, workdir),
    }
    soak: Soak | None = None
    status = 1
    interrupted = False
    try:
        media = Media.make()
        started = time.monotonic()
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_ready(240)
        print(
            f"soak: {args.clients} clients for {args.minutes:g} min; servers up in "
            f"{time.monotonic() - started:.1f} s"
        )
        for name, server in servers.items():
            print(
                f"  {name}: {server.url} pid {server.proc.pid}: omni serve "
                f"{server.deploy.relative_to(REPO)} {' '.join(server.flags)}"
            )
        soak = Soak(args, servers, media)
        for note in soak.notes:
            print(f"  note: {note}")
        kill = "off" if args.kill_at is None else f"at {args.kill_at:g} s"
        print(f"  kinds (weight): {', '.join(f'{k} ({w})' for k, (_, w) in soak.kinds.items())}")
        print(f"  stage kill: {kill}; log files in {workdir}", flush=True)
        status = asyncio.run(soak.run())
        if status == 0:
            report(soak, servers, voices_dir)
    except KeyboardInterrupt:
        interrupted = True
        print("\nsoak: interrupted; stopping the servers", file=sys.stderr, flush=True)
    except RuntimeError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        status = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the servers are stopped whatever comes
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for server in servers.values():
            server.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if interrupted:
        if soak is not None and soak.results:
            print("\nso far:")
            for line in table(soak.results, soak.all_kinds()):
                print(line)
            print_samples(soak)
        print(f"logs kept in {workdir}")
        return 130
    if soak is not None and status == 0:
        stopped = stop_checks(servers)
        checks = soak.checks + stopped
        for ok, name, says in stopped:
            print(f"{'PASS' if ok else 'FAIL'}  {name:<14} {says}")
        failed = [name for ok, name, _ in checks if not ok]
        print(f"\nsoak: {'PASS' if not failed else 'FAIL (' + ', '.join(failed) + ')'}")
        status = 1 if failed else 0
    if status != 0 or args.keep:
        print(f"logs kept in {workdir}")
        for server in servers.values():
            if status != 0:
                print(f"  {server.name} log tail:\n{server.log_tail(8)}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return status


def print_samples(soak: Soak) -> None:
    shown = {key: notes for key, notes in soak.samples.items() if key[1] != "429"}
    if shown:
        print("\nnot-2xx outcomes, examples:")
        for (kind, cls), notes in sorted(shown.items()):
            for note in notes:
                print(f"  {kind} {cls}: {note}")


def report(soak: Soak, servers: dict[str, Server], voices_dir: Path) -> None:
    tail = soak.results[soak.last_shown :]
    if tail:
        soak.print_block(
            f"[end] requests finished {_clock(soak.last_tick)}-end",
            tail,
            soak.final,
        )
    print(
        f"\ntotal, {_clock(soak.duration)} with {soak.args.clients} clients"
        + (", outside the kill window:" if soak.kill_window() else ":")
    )
    window = soak.kill_window()
    inside = [r for r in soak.results if soak.in_kill_window(r)]
    outside = [r for r in soak.results if not soak.in_kill_window(r)]
    for line in table(outside if window else soak.results, soak.all_kinds()):
        print(line)
    if window:
        end = "never recovered" if window[1] == float("inf") else f"{window[1]:.1f} s"
        print(f"\ninside the kill window ({window[0]:.1f} s - {end}), speech requests only:")
        for line in table(
            inside, [k for k in soak.all_kinds() if soak.kinds.get(k, ("speech",))[0] == "speech"]
        ):
            print(line)
    if soak.cancelled:
        print(f"\n{soak.cancelled} requests cancelled at the end (still running after the drain)")
    print_samples(soak)
    slowest = sorted((r for r in soak.results if r.cls == "2xx"), key=lambda r: -r.latency)[:5]
    if slowest:
        print("\nslowest successful requests:")
        for r in slowest:
            where = " (kill window)" if soak.in_kill_window(r) else ""
            first = "" if r.first is None else f", first audio/chunk at {r.first - r.start:.2f} s"
            print(
                f"  {r.kind} {r.latency:.2f} s{first}, {r.start:.1f}-{r.end:.1f} s into the run"
                + where
            )
    if soak.args.results:
        with open(soak.args.results, "w") as out:
            for r in soak.results:
                row = {**vars(r), "cls": r.cls, "kill_window": soak.in_kill_window(r)}
                out.write(json.dumps(row) + "\n")
        print(f"\nevery outcome written to {soak.args.results}")
    print("\nat the end:")
    for name, snap in soak.final.items():
        print(f"  server {name:<6} {snap.describe()}")
    print()
    soak.checks = [*verdicts(soak, servers), voices_dir_check(soak, voices_dir)]
    for ok, name, says in soak.checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name:<14} {says}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
