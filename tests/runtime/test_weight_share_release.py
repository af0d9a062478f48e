"""Weight sharing at the release's size (slow): two Qwen3-TTS 0.6B replicas on the CPU.

The acceptance of weight sharing, where the weights dominate memory (with the
tiny preset the interpreter does): dummy weights at the 0.6B release's shapes
(a checkpoint directory of configs only, as ``benchmarks/bench_qwen3_tts.py``
writes it). Two shared replicas speak exactly as two unshared ones for the
same seed; their proportional memory (PSS) together is at most 1.2x one
unshared replica's, with and without the oneDNN repacking; a SIGKILLed leader
restarts with its follower and the next requests succeed; nothing is left in
/dev/shm. Each case starts four 0.6B processes: minutes on two cores.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_qwen3_tts import write_configs

from omni_core.testing import plan_on_cpu

pytest.importorskip("omni_qwen3_tts")
pytestmark = [pytest.mark.slow, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "qwen3_tts_demo.toml"
REQUEST = {"input": "Hello there", "voice": "serena", "seed": 3, "max_frames": 6}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("qwen3-tts-0.6b")
    write_configs(root, 6)
    return root


def pss(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(int(line.split()[1]) * 1024 for line in rollup if line.startswith("Pss:"))


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


async def speak(runtime) -> np.ndarray:
    handle = await runtime.dispatch(dict(REQUEST))
    chunks = [
        np.asarray(event.data, dtype=np.float32).ravel()
        async for event in handle.stream()
        if not event.final and not isinstance(event.data, dict)
    ]
    return np.concatenate(chunks)


def planned(plugins, base, checkpoint, share: str, pack: bool):
    flags = [
        "--model_path",
        str(checkpoint),
        "--processes.pipeline.num_replicas",
        "2",
        "--weight_share",
        share,
        "--runtime.binding",
        "round-robin",
        "--runtime.startup_timeout",
        "900",
        "--runtime.restart_backoff",
        "0.1",
        "--runtime.request_timeout",
        "600",
        "--tts_engine.engine.max_total_tokens",
        "1024",
        "--tts_engine.factory.dtype",  # float32: the layers oneDNN repacks
        "float32",
        "--tts_engine.factory.pack_weights",
        "true" if pack else "false",
    ]
    return plan_on_cpu(plugins, base, deploy=DEMO, flags=flags)


@pytest.mark.parametrize("pack", [True, False], ids=["repacked", "dense"])
async def test_two_release_size_replicas_share_one_copy(plugins, short_tmp, checkpoint, pack):
    before = shm_names()
    shared = planned(plugins, short_tmp, checkpoint, "on", pack)
    events: list[tuple[str, str]] = []
    runtime = shared.runtime(on_progress=lambda kind, name, _: events.append((kind, name)))
    async with runtime:
        audio = [await speak(runtime) for _ in range(2)]
        shared_pss = {c.name: pss(c.proc.pid) for c in runtime.children.values()}
        pids = {c.proc.pid for c in runtime.children.values()}
        if pack:  # the leader dies: its follower restarts with it, and both serve again
            os.kill(runtime.children["pipeline@r0"].proc.pid, signal.SIGKILL)
            with anyio.fail_after(900):
                while ("restarted", "pipeline@r0") not in events or runtime.health()[
                    "status"
                ] != "healthy":
                    await anyio.sleep(0.2)
            assert runtime.children["pipeline@r1"].restarts == 1
            audio += [await speak(runtime) for _ in range(2)]
            pids |= {c.proc.pid for c in runtime.children.values()}
    leaked = [n for n in shm_names() - before if any(f"_{p}_" in n for p in pids)]
    assert leaked == [] and not any(n.startswith("omni") for n in shm_names() - before)

    unshared = planned(plugins, short_tmp, checkpoint, "off", pack)
    async with unshared.runtime() as runtime:
        expected = [await speak(runtime) for _ in range(2)]
        unshared_pss = {c.name: pss(c.proc.pid) for c in runtime.children.values()}

    assert expected[0].size > 0 and np.array_equal(expected[0], expected[1])
    for got in audio:
        assert np.array_equal(got, expected[0])
    one = max(unshared_pss.values())
    total = sum(shared_pss.values())
    print(f"PSS shared {shared_pss}, unshared {unshared_pss}: {total / one:.2f}x one replica")
    assert one > 2 * 1024**3  # release size: the weights (float32) dominate
    assert total <= 1.2 * one
