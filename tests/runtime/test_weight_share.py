"""Weight sharing at run time, on the CPU: replicas map their leader's weights.

The small ``t-share`` pipeline (``omni_test_sharing``) checks the mechanism
and its failures; the Qwen3-TTS demo (the tiny preset, dummy weights) checks
that a real model family loads through the seam and answers as unshared
replicas do. Memory at release size is in ``test_weight_share_release.py``
(slow) and ``benchmarks/bench_weight_share.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import omni_test_sharing as ts

from omni_core.runtime.processes import StartupError
from omni_core.testing import plan_on_cpu

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "qwen3_tts_demo.toml"
SHM = Path("/dev/shm")
SHARED = ("--processes.p.num_replicas", "2", "--weight_share", "on")
QUICK = ("--runtime.restart_backoff", "0.05", "--runtime.binding", "round-robin")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def share_plugins(plugins):
    with plugins.registered(ts, ts.HERE):
        yield plugins


def shm_names() -> set[str]:
    return {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()


def ours(names: set[str], pids: set[int]) -> list[str]:
    """Entries of /dev/shm that a process of ours could have named (torch's, or omni's)."""
    return sorted(n for n in names if n.startswith("omni") or any(f"_{pid}_" in n for pid in pids))


def pids_of(runtime) -> set[int]:
    return {c.proc.pid for c in runtime.children.values() if c.proc is not None}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def unshared_answer(x: float) -> list[float]:
    """What the stage computes with weights it filled itself, in this process."""
    stage = ts.create_weights()
    with torch.no_grad():
        return stage.model(torch.full((1, 64), x)).flatten().tolist()


async def test_followers_map_the_leaders_weights(share_plugins, short_tmp):
    planned = plan_on_cpu(share_plugins, short_tmp, pipeline="t-share", flags=[*SHARED, *QUICK])
    assert [(g.leader, g.followers, g.gpu) for g in planned.plan.weight_share.groups] == [
        ("p@r0", ["p@r1"], None)
    ]
    before = shm_names()
    runtime = planned.runtime()
    async with runtime:
        answers = [await runtime.run({"x": 0.5}) for _ in range(2)]
        pids = pids_of(runtime)
        roles = {n: p["weight_share"] for n, p in runtime.health()["processes"].items()}
        assert roles == {"p@r0": "leader", "p@r1": "follower"}
        assert ours(shm_names() - before, pids) == []  # the memory has no name at all
    by_role = {a["weights"]["role"]: a["weights"] for a in answers}
    assert set(by_role) == {"leader", "follower"}
    assert by_role["leader"]["pid"] != by_role["follower"]["pid"]
    assert by_role["leader"]["y"] == by_role["follower"]["y"] == unshared_answer(0.5)
    for answer in by_role.values():
        assert answer["mapped"] and answer["memfd"]  # both read the one sealed memfd
    assert ours(shm_names() - before, pids) == []
    assert not os.path.exists(planned.plan.endpoints.runtime_dir)


@pytest.mark.slow  # two restarts of a sharing group (~10 s): make test-all
async def test_a_dead_follower_restarts_alone_a_dead_leader_with_its_followers(
    share_plugins, short_tmp
):
    planned = plan_on_cpu(share_plugins, short_tmp, pipeline="t-share", flags=[*SHARED, *QUICK])
    events: list[tuple[str, str]] = []
    runtime = planned.runtime(on_progress=lambda kind, name, _: events.append((kind, name)))
    async with runtime:
        leader, follower = runtime.children["p@r0"], runtime.children["p@r1"]
        # A follower alone: it maps the same leader again, the leader serves on.
        os.kill(follower.proc.pid, signal.SIGKILL)
        with anyio.fail_after(60):
            while ("restarted", "p@r1") not in events:
                await anyio.sleep(0.05)
        assert (leader.restarts, follower.restarts) == (0, 1)
        # The leader: its followers restart with it, after it.
        old = {leader.proc.pid, follower.proc.pid}
        os.kill(leader.proc.pid, signal.SIGKILL)
        with anyio.fail_after(60):
            while not (("restarted", "p@r0") in events and runtime.health()["status"] == "healthy"):
                await anyio.sleep(0.05)
        assert (leader.restarts, follower.restarts) == (1, 2)
        assert not any(alive(pid) for pid in old)  # the follower was stopped, not left mapping
        assert follower.started_at >= leader.ready_at  # in order: leader ready, then followers
        answers = [(await runtime.run({"x": 2.0}))["weights"] for _ in range(2)]
    assert {a["role"] for a in answers} == {"leader", "follower"}
    assert answers[0]["y"] == answers[1]["y"] == unshared_answer(2.0)
    assert all(a["mapped"] for a in answers)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--weights.factory.fail_after_load", "true"), "asked to fail after loading"),
        (
            ("--weights.factory.follower_width", "32"),
            r"p@r1 failed to start(.|\n)*leader's weights do not match this model",
        ),
        (("--weights.factory.seam", "false"), "none of its stage factories loaded weights"),
    ],
    ids=["leader-fails-after-publishing", "follower-mismatch", "no-seam"],
)
async def test_a_failed_start_says_who_and_leaves_nothing(
    share_plugins, short_tmp, flags, expected
):
    planned = plan_on_cpu(
        share_plugins, short_tmp, pipeline="t-share", flags=[*SHARED, *QUICK, *flags]
    )
    before = shm_names()
    runtime = planned.runtime()
    with pytest.raises(StartupError, match=expected):
        async with runtime:
            pass  # pragma: no cover
    pids = pids_of(runtime)
    assert pids and not any(alive(pid) for pid in pids)
    assert ours(shm_names() - before, pids) == []
    assert not os.path.exists(planned.plan.endpoints.runtime_dir)


PARENT = textwrap.dedent(
    """
    import signal, sys, anyio
    sys.path.insert(0, {here!r})
    import omni_test_sharing as ts
    from omni_core.plugins import OmniPlugins
    from omni_core.testing import plan_on_cpu

    async def main():
        plugins = OmniPlugins()
        plugins.register(ts, name=ts.HERE)
        planned = plan_on_cpu(plugins, {base!r}, pipeline="t-share", flags={flags!r})
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async with planned.runtime() as runtime:  # SIGTERM: a graceful stop, as omni serve's
                await runtime.run({{"x": 1.0}})
                pids = [c.proc.pid for c in runtime.children.values()]
                print(" ".join(map(str, pids)), flush=True)
                async for _ in signals:
                    break

    anyio.run(main)
    """
)


@pytest.mark.parametrize(
    "sig",
    # SIGKILL, which leaves the parent no chance to clean up, stays in make test
    [pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGKILL],
    ids=["sigterm", "sigkill"],
)
def test_a_stopped_parent_leaves_no_process_and_no_shared_memory(short_tmp, sig):
    before = shm_names()
    code = PARENT.format(
        here=str(Path(__file__).parent), base=str(short_tmp), flags=[*SHARED, *QUICK]
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = parent.stdout.readline()
        assert line.strip(), parent.stderr.read()
        pids = {int(p) for p in line.split()}
        assert len(pids) == 2 and all(alive(p) for p in pids)
        parent.send_signal(sig)
        assert parent.wait(60) == (0 if sig == signal.SIGTERM else -sig)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids)  # stopped by the parent, or died with it
        assert ours(shm_names() - before, pids) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# -- a real model family: the Qwen3-TTS demo -------------------------------------------


async def speak(runtime, request: dict) -> np.ndarray:
    """The audio a speech request streams, as one array."""
    handle = await runtime.dispatch(dict(request))
    chunks = [
        np.asarray(event.data, dtype=np.float32).ravel()
        async for event in handle.stream()
        if not event.final and not isinstance(event.data, dict)
    ]
    return np.concatenate(chunks)


@pytest.mark.slow  # ~12-17 s in make test, which must stay under 5 minutes: make test-all
async def test_qwen3_tts_demo_replicas_share_and_speak_as_unshared_ones(plugins, short_tmp):
    pytest.importorskip("omni_qwen3_tts")
    request = {"input": "Hello there", "voice": "serena", "seed": 3, "max_frames": 12}
    flags = ["--processes.pipeline.num_replicas", "2", "--runtime.binding", "round-robin"]
    outputs = {}
    for share in ("on", "off"):
        planned = plan_on_cpu(
            plugins, short_tmp, deploy=DEMO, flags=[*flags, "--weight_share", share]
        )
        async with planned.runtime() as runtime:
            outputs[share] = [await speak(runtime, request) for _ in range(2)]
            if share == "on":
                follower = runtime.children["pipeline@r1"].proc.pid
                with open(f"/proc/{follower}/maps") as maps:
                    assert "memfd:omni-weights" in maps.read()
    audio = [a for share in ("on", "off") for a in outputs[share]]
    assert audio[0].size > 1000 and float(np.abs(audio[0]).max()) > 0
    for other in audio[1:]:
        assert np.array_equal(audio[0], other)
