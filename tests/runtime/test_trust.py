"""Trust boundaries of a running deployment: forged IPC frames, hung processes.

The forged frames are what another local user (or anyone who reaches a TCP
port) could write: a pickle that would run a command, framed as our
transport frames them or bare, with no proof of the deployment's secret.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import time
from pathlib import Path

import anyio
import pytest

sys.path.insert(0, str(Path(__file__).parent))


from omni_core.runtime import RequestFailed
from omni_core.runtime.coordinator import Unavailable
from omni_core.runtime.transports._auth import MAGIC, sender_hello
from omni_core.runtime.transports._wire import HEADER
from omni_core.runtime.transports._wire import MAGIC as FRAME_MAGIC

pytestmark = pytest.mark.anyio
OMNI = [sys.executable, "-m", "omni_core"]


class RunsACommand:
    """What an attacker pickles: unpickling it would run ``touch MARKER``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def forgeries(marker: Path) -> dict[str, bytes]:
    evil = pickle.dumps(RunsACommand(marker))
    meta = pickle.dumps((evil, [], None, []))
    frame = HEADER.pack(FRAME_MAGIC, 0, len(meta)) + meta
    evil_meta = HEADER.pack(FRAME_MAGIC, 0, len(evil)) + evil
    # msgpack of {"kind": "deliver"} (fixmap, fixstr...), as a msgpack peer would send
    msgpack = b"\x81\xa4kind\xa7deliver"
    wrong_proof = MAGIC + bytes(8) + os.urandom(32) + os.urandom(32)
    return {
        "a transport frame whose skeleton is evil": frame,
        "a transport frame whose metadata is evil": evil_meta,
        "a bare pickle": evil,
        "msgpack": msgpack,
        "a wrong proof, then an evil frame": wrong_proof + frame,
        "a proof made with another secret, then an evil frame": (
            sender_hello(os.urandom(32), "unix:/nowhere")[0] + frame
        ),
    }


def send_raw(path: str, payload: bytes) -> bytes:
    """Write ``payload`` to the Unix socket at ``path``; what came back before EOF."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect(path)
        sock.sendall(payload)
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return received


@pytest.mark.parametrize("transport", ["shm", "socket"])
async def test_forged_frames_to_every_socket_run_nothing_and_harm_nothing(
    deployment, transport, tmp_path
):
    marker = tmp_path / "pwned"
    runtime = deployment("t-fan-in", "--runtime.transport", transport)
    async with runtime:
        sockets = sorted(Path(runtime.plan.endpoints.runtime_dir).glob("*.sock"))
        endpoints = runtime.plan.endpoints
        planned = {endpoints.coordinator, *endpoints.processes.values()}
        assert planned <= {str(p) for p in sockets}, sockets  # the coordinator, every process
        for path in sockets:
            assert (path.stat().st_mode & 0o777) == 0o600, path
            for name, payload in forgeries(marker).items():
                answer = await anyio.to_thread.run_sync(send_raw, str(path), payload)
                assert answer == b"", f"{path.name} answered {name}: {answer!r}"
        await anyio.sleep(0.5)
        assert not marker.exists()
        outputs = await runtime.run({"images": [1], "audio": [2]})
        assert outputs["join"]["sources"] == ["audio", "images", "pre"]
        assert runtime.health()["status"] == "healthy"
        logs = "".join(p.read_text() for p in Path(runtime.log_dir).iterdir())
    assert not marker.exists()
    assert "refused a connection" in logs and "wrong proof of the deployment secret" in logs


async def test_a_hung_process_is_declared_unresponsive_failed_and_restarted(deployment):
    timeout = 1.5
    flags = ["--runtime.heartbeat_timeout", str(timeout), "--runtime.restart_backoff", "0.2"]
    async with deployment("t-two-process", *flags) as runtime:
        victim = runtime.children["second"]
        old_pid = victim.proc.pid
        handle = await runtime.dispatch({"delay": {"b": 60}})
        await anyio.sleep(0.3)  # the request is now in stage b, in process "second"
        os.kill(old_pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            seen: set[str] = set()
            with anyio.fail_after(timeout + 3):
                while "unresponsive" not in seen:
                    seen.add(runtime.health()["processes"]["second"]["state"])
                    await anyio.sleep(0.02)
            with pytest.raises(RequestFailed) as failed, anyio.fail_after(2):
                await handle.result()
            waited = time.monotonic() - stopped
        finally:
            # SIGKILL has reached it already; SIGCONT is harmless either way
            with anyio.CancelScope(shield=True):
                if _running(old_pid):
                    os.kill(old_pid, signal.SIGCONT)
        message = str(failed.value)
        assert failed.value.process_lost  # the API answers 503: a retry can succeed
        assert "process second is unresponsive: no heartbeat for" in message
        assert "runtime.heartbeat_timeout is 1.5 s" in message
        assert waited < timeout + 2.5, waited
        with anyio.fail_after(20):
            while runtime.health()["status"] != "healthy":
                await anyio.sleep(0.05)
        health = runtime.health()["processes"]["second"]
        assert health["restarts"] == 1 and "unresponsive" in health["last_exit"]
        assert victim.proc.pid != old_pid and not _running(old_pid)
        outputs = await runtime.run({}, timeout=10)
    assert "b" in outputs


async def test_health_says_restarting_until_admission_takes_the_process_again(deployment):
    """A restarted process is ready a moment before its restart finishes: /health must not
    say healthy while requests would still be refused (the hang test above raced on it)."""
    async with deployment("t-two-process") as runtime:
        plan = runtime.children["second"].plan
        runtime.coordinator.unavailable[(plan.logical, plan.replica)] = "restarting (test)"
        health = runtime.health()
        assert health["processes"]["second"]["state"] == "restarting"
        assert health["status"] == "degraded"
        with pytest.raises(Unavailable):
            await runtime.run({}, timeout=10)
        runtime.coordinator.unavailable.clear()
        assert runtime.health()["status"] == "healthy"
        assert "b" in await runtime.run({}, timeout=10)


async def test_long_work_off_the_event_loop_is_not_mistaken_for_a_hang(deployment):
    flags = ["--runtime.heartbeat_timeout", "1"]
    async with deployment("t-two-process", *flags) as runtime:
        outputs = await runtime.run({"compute": {"b": 3.0}}, timeout=20)
        health = runtime.health()["processes"]["second"]
    assert "b" in outputs
    assert health["restarts"] == 0 and health["state"] == "healthy"
    assert 0 <= health["heartbeat_age_seconds"] < 1


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("value", ["0.1", "0", "-1", "7200"])
def test_a_nonsensical_heartbeat_timeout_is_refused_before_anything_starts(value):
    import subprocess

    done = subprocess.run(
        [*OMNI, "plan", "--pipeline", "qwen3-tts", "--runtime.heartbeat_timeout", value],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "heartbeat_timeout must be in 0.5-3600 seconds" in done.stderr
    assert "--runtime.heartbeat_timeout" in done.stderr and "Traceback" not in done.stderr
