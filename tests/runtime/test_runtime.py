"""The runtime end to end, with real child processes running simple stages."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest

sys.path.insert(0, str(Path(__file__).parent))


from omni_core.runtime import Overloaded, RequestFailed

pytestmark = pytest.mark.anyio


def _pids(trail):
    return {entry.split(":")[0]: int(entry.split(":")[1]) for entry in trail}


async def test_linear_pipeline_in_one_process(deployment):
    async with deployment("t-linear") as runtime:
        outputs = await runtime.run({"trail": []})
    pids = _pids(outputs["c"]["trail"])
    assert list(pids) == ["a", "b", "c"]
    assert len(set(pids.values())) == 1 and os.getpid() not in pids.values()


async def test_two_processes(deployment):
    async with deployment("t-two-process") as runtime:
        outputs = await runtime.run({})
    pids = _pids(outputs["b"]["trail"])
    assert pids["a"] != pids["b"]


async def test_fan_in_waits_for_the_routed_sources_only(deployment):
    async with deployment("t-fan-in") as runtime:
        both = await runtime.run({"images": [1], "audio": [2]})
        text_only = await runtime.run({})
        images_only = await runtime.run({"images": [1]})
    assert both["join"]["sources"] == ["audio", "images", "pre"]
    assert text_only["join"]["sources"] == ["pre"]
    assert images_only["join"]["sources"] == ["images", "pre"]


async def test_stream_to_delivers_chunks_before_the_upstream_finishes(deployment):
    async with deployment("t-stream") as runtime:
        handle = await runtime.dispatch({"n": 5})
        events = [event async for event in handle.stream()]
    chunks = [e.data for e in events if not e.final]
    finals = [e for e in events if e.final]
    assert chunks == [0, 2, 4, 6, 8]
    assert [(e.stage, e.data) for e in finals] == [("doubler", {"received": 5})]


async def test_a_request_completes_when_all_terminals_have(deployment):
    async with deployment("t-two-terminals") as runtime:
        outputs = await runtime.run({})
    assert set(outputs) == {"left", "right"}


async def test_replicas_bind_each_request_to_one_replica_across_its_stages(deployment):
    flags = ["--processes.work.num_replicas", "2", "--runtime.binding", "round-robin"]
    async with deployment("t-replicas", *flags) as runtime:
        results = [await runtime.run({}) for _ in range(4)]
    work_pids = []
    for outputs in results:
        pids = _pids(outputs["back"]["trail"])
        assert pids["mid"] == pids["back"]  # sticky: both stages of one replica
        work_pids.append(pids["mid"])
    assert len(set(work_pids)) == 2  # round-robin used both replicas


async def test_a_stage_that_raises_fails_only_that_request(deployment):
    async with deployment("t-linear") as runtime:
        with pytest.raises(RequestFailed, match="stage 'b' failed: ValueError: asked to fail at b"):
            await runtime.run({"fail_at": "b"})
        outputs = await runtime.run({})
    assert "c" in outputs


async def test_a_route_function_may_only_choose_declared_targets(deployment):
    async with deployment("t-bad-route") as runtime:
        with pytest.raises(RequestFailed, match="not declared targets"):
            await runtime.run({})


async def test_admission_is_bounded(deployment):
    async with deployment("t-linear", "--runtime.max_inflight", "2") as runtime:
        slow = {"delay": {"a": 0.5}}
        first = await runtime.dispatch(slow)
        second = await runtime.dispatch(slow)
        with pytest.raises(Overloaded):
            await runtime.dispatch(slow)
        await first.result()
        await second.result()


async def test_killed_child_fails_its_requests_restarts_and_serves_again(deployment):
    async with deployment("t-two-process", "--runtime.restart_backoff", "0.1") as runtime:
        victim = runtime.children["second"]
        handles = [await runtime.dispatch({"delay": {"b": 30}}) for _ in range(3)]
        await anyio.sleep(0.3)
        os.kill(victim.proc.pid, signal.SIGKILL)
        started = time.monotonic()
        for handle in handles:
            with pytest.raises(RequestFailed, match="process second was killed by SIGKILL"):
                await handle.result()
        assert time.monotonic() - started < 10  # at the kill, not after the 30 s delay
        with anyio.fail_after(30):
            while runtime.health()["processes"]["second"]["state"] != "healthy":
                await anyio.sleep(0.05)
        assert runtime.health()["processes"]["second"]["restarts"] == 1
        assert "b" in await runtime.run({})


def _segments(pids: list[int]) -> set[str]:
    # Other test workers' processes make and remove entries concurrently; what this
    # runtime could leak is omni's, or torch's named after one of its processes.
    return {
        name
        for name in os.listdir("/dev/shm")
        if name.startswith("omni") or any(f"_{pid}_" in name for pid in pids)
    }


async def test_closing_leaves_no_process_directory_or_segment(deployment):
    before = set(os.listdir("/dev/shm"))
    runtime = deployment("t-stream")
    async with runtime:
        pids = [c.proc.pid for c in runtime.children.values()]
        await runtime.run({"n": 3})
        runtime_dir = runtime.plan.endpoints.runtime_dir
        assert os.path.isdir(runtime_dir)
    assert not os.path.exists(runtime_dir)
    for pid in pids:
        assert not _running(pid)
    assert _segments(pids) - before == set()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_failed_start_reports_the_child_traceback_and_tears_down(deployment):
    runtime = deployment("t-broken")
    with pytest.raises(Exception) as info:
        async with runtime:
            pass  # pragma: no cover
    message = str(info.value)
    assert "process bad failed to start" in message
    assert "RuntimeError: no weights here" in message and "Traceback" in message
    for child in runtime.children.values():
        assert child.proc is None or not child.proc.is_alive()
    assert not os.path.exists(runtime.plan.endpoints.runtime_dir)


async def test_a_start_that_hangs_times_out_with_the_log_tail(deployment):
    runtime = deployment("t-slow-start", "--runtime.startup_timeout", "1.5")
    with pytest.raises(Exception) as info:
        async with runtime:
            pass  # pragma: no cover
    assert "process p did not become ready in 1.5 s; last log lines:" in str(info.value)
    assert not runtime.children["p"].proc.is_alive()


async def test_cancelling_start_up_still_stops_what_started(deployment):
    """A signal during start-up cancels the caller; the children must stop all the same."""
    runtime = deployment("t-slow-start")  # its stage sleeps 60 s while loading

    async def serve() -> None:
        async with runtime:
            pass  # pragma: no cover

    async with anyio.create_task_group() as group:  # as `omni serve` cancels on SIGTERM
        group.start_soon(serve)
        await anyio.sleep(1.0)
        group.cancel_scope.cancel()
    assert not runtime.children["p"].proc.is_alive()
    assert not os.path.exists(runtime.plan.endpoints.runtime_dir)


async def test_stage_env_defaults_never_override_the_user(deployment, monkeypatch):
    monkeypatch.setenv("OMNI_TEST_USER", "user")
    async with deployment("t-env") as runtime:
        outputs = await runtime.run({"names": ["OMNI_TEST_DEFAULT", "OMNI_TEST_USER"]})
    assert outputs["env"] == {"OMNI_TEST_DEFAULT": "from-stage", "OMNI_TEST_USER": "user"}


async def test_cold_start_is_recorded_per_stage(deployment):
    async with deployment("t-linear") as runtime:
        health = runtime.health()
    assert health["status"] == "healthy"
    assert set(health["processes"]["p"]["cold_start_seconds"]) == {"a", "b", "c"}


async def test_timeout_aborts_the_request_in_every_stage(deployment):
    async with deployment("t-two-process") as runtime:
        with pytest.raises(TimeoutError):
            await runtime.run({"delay": {"b": 30}}, timeout=0.5)
        assert runtime.coordinator.inflight == 0
        assert "b" in await runtime.run({})


@pytest.mark.slow  # omni serve's own case stays in make test (test_cli_serve.py)
def test_children_die_with_a_sigkilled_parent(tmp_path, short_tmp):
    script = tmp_path / "parent.py"
    script.write_text(
        f"""
import sys, anyio
sys.path.insert(0, {str(Path(__file__).parent)!r})
import omni_test_pipelines as tp
from omni_core.plugins import OmniPlugins
from omni_core.config import load_deployment
from omni_core.plan.planner import plan_deployment
from omni_core.runtime import Runtime

async def main():
    plugins = OmniPlugins()
    plugins.register(tp, tp.HERE)
    flags = ["--placement.policy", "cpu", "--endpoints.base_path", {str(short_tmp)!r}]
    res = load_deployment(None, flags, pipeline="t-two-process", plugins=plugins)
    plan = plan_deployment(res.config, plugins=plugins)
    async with Runtime(plan, res.config, plugins=plugins, plugin_modules=[tp.HERE]) as rt:
        print(" ".join(str(c.proc.pid) for c in rt.children.values()), flush=True)
        await anyio.sleep(60)

if __name__ == "__main__":  # spawned children import this module again
    anyio.run(main)
"""
    )
    import subprocess

    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2
        parent.kill()
        parent.wait(5)
        deadline = time.monotonic() + 5
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(p) for p in pids)
    finally:
        parent.kill()


async def test_exhausted_restarts_leave_the_deployment_unhealthy_with_clear_errors(deployment):
    from omni_core.runtime import Unavailable

    async with deployment("t-two-process", "--runtime.restart_attempts", "0") as runtime:
        victim = runtime.children["second"]
        os.kill(victim.proc.pid, signal.SIGKILL)
        with anyio.fail_after(10):
            while runtime.health()["status"] != "unhealthy":
                await anyio.sleep(0.05)
        assert runtime.health()["processes"]["second"]["state"] == "failed"
        with pytest.raises(Unavailable, match="process second was killed by SIGKILL"):
            await runtime.dispatch({})


@pytest.mark.parametrize("transport", ["socket", "shm"])
async def test_every_edge_between_processes_can_use_another_transport(deployment, transport):
    async with deployment("t-stream", "--runtime.transport", transport) as runtime:
        handle = await runtime.dispatch({"n": 4})
        chunks = [e.data async for e in handle.stream() if not e.final]
    assert chunks == [0, 2, 4, 6]
    assert {name for name, _ in runtime.links.listens(None)} == {transport}


async def test_health_reports_each_stages_queue_depth(deployment):
    async with deployment("t-fan-in") as runtime:

        def queue() -> dict:
            return runtime.health()["processes"]

        slow = {"images": [1], "delay": {"images": 3.0}}
        handles = [await runtime.dispatch(slow) for _ in range(3)]
        with anyio.fail_after(10):
            while queue()["enc"]["queue"].get("images", {}).get("running") != 3:
                await anyio.sleep(0.05)
        # the fan-in stage holds the three requests while it waits for their images
        # (each process reports every 0.5 s on its own clock: wait for p's report)
        with anyio.fail_after(2.0):
            while queue()["p"]["queue"].get("join") != {"running": 0, "waiting": 3}:
                await anyio.sleep(0.02)
        for handle in handles:
            await handle.result()
        with anyio.fail_after(10):
            while (
                queue()["enc"]["queue"]["images"]["running"]
                or queue()["p"]["queue"]["join"]["waiting"]
            ):
                await anyio.sleep(0.05)


async def test_an_ended_request_stops_what_still_runs_upstream(deployment, tmp_path):
    # The terminal stage stops after two chunks; the producer would stream forever.
    marker = tmp_path / "producer-cancelled"
    async with deployment("t-stream") as runtime:
        outputs = await runtime.run({"forever": True, "stop_after": 1, "marker": str(marker)})
        with anyio.fail_after(10):
            while not marker.exists():
                await anyio.sleep(0.02)
    assert outputs["doubler"] == {"received": 2}
    assert marker.read_text() == "cancelled"


async def test_a_streaming_stage_can_skip_a_target_and_what_depends_on_it(deployment):
    async with deployment("t-stream-two-ways") as runtime:
        both = await runtime.run({"n": 2})
        one = await runtime.run({"n": 2, "skip": ["speaker"]})
        with pytest.raises(RequestFailed, match="cannot skip"):
            await runtime.run({"n": 2, "skip": ["echo"]})  # not a direct target
    assert set(both) == {"doubler", "echo"}
    assert both["echo"]["trail"] and both["echo"]["received"] == 2
    assert one == {"doubler": {"received": 2}}  # echo, fed only by speaker, is skipped too
