"""``omni serve`` and ``omni run`` as real subprocesses: output, exit codes, signals, cleanup."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import Any

import openai
import pytest
from serve_helpers import alive, descendants, wait_ready

from omni_core.plan.threads import SHARED_CORES_SPIN

LAUNCH = [sys.executable, str(Path(__file__).parent / "omni_launch.py")]


def omni(*args: object, base: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*LAUNCH, *map(str, args), "--endpoints.base_path", str(base)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_run_writes_a_wav(short_tmp):
    out = short_tmp / "out.wav"
    done = omni(
        "run",
        "--pipeline",
        "t-speech",
        "--text",
        "one two three",
        "--voice",
        "bob",
        "-o",
        out,
        base=short_tmp,
    )
    assert done.returncode == 0, done.stderr
    with wave.open(str(out)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getnframes()) == (24000, 1, 3600)
    assert "front: ready in" in done.stderr and "back: ready in" in done.stderr
    assert f"wrote {out} (0.15 s of audio at 24000 Hz)" in done.stderr
    assert os.listdir(short_tmp) == ["out.wav"]  # the runtime directory is gone


@pytest.mark.slow  # omni run answering a prompt stays in make test (test_walkthrough.py)
def test_run_prints_a_chat_reply(short_tmp):
    done = omni("run", "--pipeline", "t-chat", "--prompt", "hi there", base=short_tmp)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "You said: hi there\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--pipeline", "t-speech", "--text", "hi", "--voice", "zed", "-o", "x.wav"],
            "error: unknown voice 'zed'; voices: alice, bob",
        ),
        (
            ["--pipeline", "t-speech", "--text", "hi", "--prompt", "hi"],
            "give exactly one of --text (speech) or --prompt (chat)",
        ),
        (
            ["--pipeline", "t-speech", "--text", "hi", "-o", "x.mp3"],
            "cannot tell the audio format of 'x.mp3'",
        ),
        (
            ["--pipeline", "t-chat", "--text", "hi", "-o", "x.wav"],
            "pipeline 't-chat' does not serve speech; use --prompt",
        ),
        (
            ["--pipeline", "t-speech", "--text", "hi", "-o", "x.wav", "--no-such.field", "1"],
            "no-such",
        ),
    ],
)
def test_run_mistakes_exit_2_without_a_traceback(short_tmp, args, message):
    done = omni("run", *args, base=short_tmp)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_refuses_a_taken_port_before_loading_anything(short_tmp):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = omni("serve", "--pipeline", "t-speech", "--port", port, base=short_tmp)
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "loading" not in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 30


class Served:
    """An ``omni serve`` subprocess, up once it printed its address."""

    def __init__(
        self,
        base: Path,
        *args: str,
        env: dict[str, str] | None = None,
        unset: tuple[str, ...] = (),
    ):
        self.base = base
        self.log = (base / "serve.err").open("w+")
        self.proc = subprocess.Popen(
            [
                *LAUNCH,
                "serve",
                "--pipeline",
                "t-speech",
                "--port",
                "0",
                "--endpoints.base_path",
                str(base),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset},
        )
        line = self.proc.stdout.readline()  # "omni: serving t-speech on http://…"
        if "serving" not in line:
            self.proc.kill()
            raise AssertionError(f"omni serve did not start: {line!r}\n{self.stderr()}")
        self.url = line.split(" on ")[1].split()[0]
        wait_ready(self.proc, 60, self.stderr)

    def stderr(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def runtime_dirs(self) -> list[str]:
        return [p.name for p in self.base.iterdir() if p.name.startswith("t-speech-")]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def _all_dead(pids: set[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def _shm_of(names: set[str], pids: set[int]) -> list[str]:
    """The entries of ``names`` that these processes could have made: omni's, or torch's
    (``torch_<pid>_<n>``). Other test workers' processes come and go in /dev/shm meanwhile."""
    return sorted(n for n in names if n.startswith("omni") or any(f"_{p}_" in n for p in pids))


def test_sigterm_stops_admitting_stops_children_and_cleans_up(short_tmp):
    shm_before = set(os.listdir("/dev/shm"))
    served = Served(short_tmp, env={"OMNI_API_KEY": "k3y"})
    try:
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="k3y", max_retries=0)
        assert client.audio.speech.create(model="t-speech", input="hi", voice="alice").content
        with pytest.raises(openai.AuthenticationError):  # OMNI_API_KEY turned auth on
            openai.OpenAI(base_url=f"{served.url}/v1", api_key="no", max_retries=0).models.list()
        children = descendants(served.proc.pid)
        assert len(children) >= 2  # the front and back stage processes
        assert len(served.runtime_dirs()) == 1
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(30) == 0
        assert _all_dead(children, within=5)
        assert served.runtime_dirs() == []
        assert _shm_of(set(os.listdir("/dev/shm")) - shm_before, children | {served.proc.pid}) == []
        log = served.stderr()
        assert "received SIGTERM: stopping" in log and "omni: stopped" in log
        assert "Traceback" not in log
    finally:
        served.close()


def test_a_bad_start_method_is_refused_before_anything_starts(short_tmp, monkeypatch):
    monkeypatch.setenv("OMNI_START_METHOD", "threads")  # the child inherits it
    ran = omni("serve", "--pipeline", "t-speech", "--port", "0", base=short_tmp)
    assert ran.returncode == 2, ran.stderr[-2000:]
    assert "OMNI_START_METHOD='threads'" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert list(short_tmp.iterdir()) == []  # no run directory left behind


def test_sigkill_of_the_parent_leaves_no_orphan(short_tmp):
    tmp = short_tmp / "tmp"  # where the fork server's socket directory goes
    tmp.mkdir(mode=0o700)
    served = Served(short_tmp, env={"TMPDIR": str(tmp)})
    try:
        children = descendants(served.proc.pid)
        assert len(children) >= 2
        assert any(p.name.startswith("pymp-") for p in tmp.iterdir())
        served.proc.send_signal(signal.SIGKILL)
        served.proc.wait(10)
        assert _all_dead(children, within=5)
        assert [p.name for p in tmp.iterdir()] == []
    finally:
        served.close()


# make test keeps the runtime's own case (test_runtime.py: cancelling start-up still stops
# what started) and omni serve's SIGTERM once ready; this one starts a server of its own
@pytest.mark.slow
def test_sigterm_during_start_up_tears_down_what_started(short_tmp):
    log = short_tmp / "serve.err"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                *LAUNCH,
                "serve",
                "--pipeline",
                "t-speech",
                "--port",
                "0",
                "--endpoints.base_path",
                str(short_tmp),
                "--audio.factory.start_delay",
                "60",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + 30
            while "front: ready" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            children = descendants(proc.pid)
            assert len(children) >= 2  # front is up, back is still "loading"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
            assert _all_dead(children, within=5)
            assert [p.name for p in short_tmp.iterdir()] == ["serve.err"]
            assert "received SIGTERM: stopping" in log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()


def test_the_server_listens_at_once_and_says_it_is_starting_until_ready(short_tmp):
    """While a stage loads, /health is a 503 "starting" with each process's state, and a
    request is a 503 that says how many processes are ready (code "starting", Retry-After)."""
    import json
    import urllib.error
    import urllib.request

    log = (short_tmp / "serve.err").open("w")
    gate = short_tmp / "let-audio-start"  # the audio stage starts once this exists
    proc = subprocess.Popen(
        [
            *LAUNCH,
            "serve",
            "--pipeline",
            "t-speech",
            "--port",
            "0",
            "--endpoints.base_path",
            str(short_tmp / "run"),
            "--audio.factory.start_gate",
            str(gate),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = line.split(" on ")[1].split()[0]
        assert "loading the processes" in line

        def get(path: str, body: bytes | None = None) -> tuple[int, dict, Any]:
            request = urllib.request.Request(
                url + path,
                data=body,
                method="POST" if body else "GET",
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    return answer.status, json.load(answer), answer.headers
            except urllib.error.HTTPError as refused:
                return refused.code, json.load(refused), refused.headers

        status, health, _ = get("/health")
        assert status == 503 and health["status"] == "starting"
        states = {name: info["state"] for name, info in health["processes"].items()}
        assert set(states) == {"front", "back"} and "starting" in states.values()
        status, body, headers = get("/v1/audio/speech", json.dumps({"input": "hi"}).encode())
        assert status == 503 and body["error"]["code"] == "starting"
        assert "processes ready" in body["error"]["message"] and headers.get("Retry-After") == "2"
        gate.touch()
        wait_ready(proc, 60)
        status, health, _ = get("/health")
        assert status == 200 and health["status"] == "healthy"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        log.close()


def test_serve_says_the_plans_notes_before_anything_starts(short_tmp):
    """A deployment that compiles with the default start-up timeout hears it from ``serve``
    too, not only from ``omni plan``: before the first process loads."""
    demo = Path(__file__).parents[2] / "examples" / "qwen3_tts_demo.toml"
    log = short_tmp / "serve.err"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                *LAUNCH,
                "serve",
                str(demo),
                "--port",
                "0",
                "--endpoints.base_path",
                str(short_tmp),
                "--tts_engine.engine.enable_torch_compile",
                "true",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + 60
            while "loading" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    said = log.read_text()
    note = said.index("omni: note: tts_engine compiles its decode steps")
    assert "runtime.startup_timeout is 120 s: raise it" in said[note:]
    assert note < said.index("loading"), said


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


def _environ(pid: int) -> dict[str, str]:
    block = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(e.partition("=")[::2] for e in block.split("\0") if e)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_fork_server_starts_with_the_openmp_settings_the_plan_gives(short_tmp):
    """OpenMP reads GOMP_SPINCOUNT when torch loads, which is in the fork server: the
    plan's value (processes' threads outnumber the cores) must be there, not only in
    the stage processes' environments, where it comes too late."""
    threads = str(os.cpu_count() or 2)  # two processes of this many: more than the cores
    # the suite's conftest sets the variable for every test: here the plan must
    served = Served(short_tmp, "--runtime.cpu_threads", threads, unset=("GOMP_SPINCOUNT",))
    try:
        tree = descendants(served.proc.pid)
        children = [  # multiprocessing's resource tracker aside
            p
            for p in tree
            if _parent_of(p) == served.proc.pid and "resource_tracker" not in _cmdline(p)
        ]
        servers = [p for p in children if "multiprocessing.forkserver" in _cmdline(p)]
        assert len(servers) == 1 and children == servers  # every stage process forked
        assert len([p for p in tree if _parent_of(p) == servers[0]]) >= 2
        assert _environ(servers[0]).get("GOMP_SPINCOUNT") == str(SHARED_CORES_SPIN)
    finally:
        served.close()


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
