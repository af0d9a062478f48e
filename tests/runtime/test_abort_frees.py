"""Whatever mix of completions, aborts, disconnects and failures, every stage ends idle.

A real three-process deployment (``t-chaos``: a stream from process a to b, and a
fan-in in b of a's and c's outputs) takes requests whose every stage may dawdle,
fail, stop reading its stream early, or be aborted at a random moment by the
client (mid-stream, after reading one chunk, at once) or by the server (a
timeout). Afterwards every stage of every process must report ``running`` and
``waiting`` 0, the coordinator must hold no request, and the stage processes'
memory must be flat after warm-up. A stream chunk that arrived after its
request's abort used to start a run nobody would end (``running`` climbed and
stayed).
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import anyio
import pytest

from omni_core.runtime.coordinator import RequestFailed

pytestmark = pytest.mark.anyio

ACTIONS = ("complete", "abort", "abort_after_chunk", "timeout")


def chaos_plan(rng: random.Random) -> dict[str, Any]:
    """What each stage of one request does: pauses, failures, an early stop."""

    def maybe(p: float) -> bool:
        return rng.random() < p

    chunks = rng.randint(1, 6)
    plan: dict[str, Any] = {
        "streamer": {
            "chunks": chunks,
            "pause": rng.choice([0.0, 0.0, 0.002, 0.01]),
            "stop_after": rng.randrange(chunks) if maybe(0.2) else None,
            "fail_after": rng.randrange(chunks) if maybe(0.05) else None,
        }
    }
    for stage in ("front", "side", "sink", "join"):
        plan[stage] = {"delay": rng.choice([0.0, 0.0, 0.003, 0.02]), "fail": maybe(0.03)}
    return plan


async def drive(runtime: Any, rng: random.Random, count: int, concurrency: int) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    limiter = anyio.Semaphore(concurrency)

    async def one(action: str, plan: dict[str, Any], wait: float) -> None:
        async with limiter:
            try:
                if action == "timeout":  # the server gives up: runtime.run aborts everywhere
                    with contextlib.suppress(TimeoutError):  # unless it finished in time
                        await runtime.run({"plan": plan}, timeout=wait)
                handle = await runtime.dispatch({"plan": plan})
                if action == "complete":
                    await handle.result()
                elif action == "abort":
                    await anyio.sleep(wait)
                    await runtime.abort(handle)
                else:  # read one chunk, then go away: a client disconnecting mid-stream
                    async for _event in handle.stream():
                        break
                    await runtime.abort(handle)  # (a no-op if it already finished)
            except RequestFailed:
                pass  # a stage failed as planned
            outcomes[action] = outcomes.get(action, 0) + 1

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            action = rng.choice(ACTIONS)
            tg.start_soon(one, action, chaos_plan(rng), rng.choice([0.0, 0.001, 0.005, 0.03]))
            await anyio.sleep(0)
    return outcomes


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


async def settle(runtime: Any, timeout: float = 15.0) -> dict[str, Any]:
    """Wait for every process to report every stage idle; return the last reports."""
    busy: dict[str, Any] = {}
    with anyio.move_on_after(timeout):
        while True:
            processes = runtime.health()["processes"]
            busy = {
                f"{name}.{stage}": depth
                for name, info in processes.items()
                for stage, depth in info["queue"].items()
                if any(depth.values())  # its own counts and its engine scheduler's
            }
            if not busy and not runtime.coordinator.inflight:
                return processes
            await anyio.sleep(0.1)
    raise AssertionError(
        f"not idle after {timeout} s: {busy}, inflight {runtime.coordinator.inflight}"
    )


@pytest.mark.parametrize(
    "count",
    [pytest.param(2000, id="2000"), pytest.param(10000, id="10000", marks=pytest.mark.slow)],
)
async def test_every_interleaving_leaves_every_stage_idle_and_memory_flat(deployment, count):
    rng = random.Random(count)
    async with deployment("t-chaos", "--runtime.max_inflight", "64") as runtime:
        warm = await drive(runtime, rng, count // 5, concurrency=32)
        await settle(runtime)
        pids = {name: child.proc.pid for name, child in runtime.children.items()}
        before = {name: rss_kib(pid) for name, pid in pids.items()}
        outcomes = await drive(runtime, rng, count - count // 5, concurrency=32)
        processes = await settle(runtime)
        after = {name: rss_kib(pid) for name, pid in pids.items()}
    assert set(warm) == set(outcomes) == set(ACTIONS), (warm, outcomes)
    assert set(processes) == {"a", "b", "c"}
    assert all(info["restarts"] == 0 for info in processes.values()), processes
    growth = {name: after[name] - before[name] for name in pids}
    assert max(growth.values()) < 20 * 1024, growth  # KiB: flat, not one leak per request


def test_a_process_remembers_the_latest_ended_requests_within_a_fixed_capacity():
    from omni_core.runtime.worker import Remembered

    ended = Remembered(3)
    for request in ("r1", "r2", "r3", "r2", "r4"):  # r2 again: it becomes the newest
        ended.add(request)
    assert len(ended) == 3
    assert "r1" not in ended and {"r2", "r3", "r4"} == {r for r in ("r2", "r3", "r4") if r in ended}
