"""Tensor-parallel rank processes under the runtime: formed, served, restarted, refused.

The stage (``omni_test_tp``) splits a small MLP over two rank processes
joined over gloo; rank 0 mirrors each request's input to rank 1.
"""

from __future__ import annotations

import os
import signal
import time

import anyio
import omni_test_tp as tp
import pytest

from omni_core.runtime.processes import StartupError
from omni_core.testing import plan_on_cpu

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _restarted(health: dict) -> bool:
    ranks = [health["processes"][name] for name in ("split_tp0", "split_tp1")]
    return health["status"] == "healthy" and all(rank["restarts"] for rank in ranks)


def _planned(plugins, short_tmp, *flags: str):
    return plan_on_cpu(plugins, short_tmp, pipeline="t-tp", flags=flags, plugin_modules=[tp.HERE])


@pytest.mark.slow  # ~30 s: two starts of two rank processes
async def test_two_ranks_answer_as_the_whole_layer_and_a_dead_rank_restarts_the_group(
    plugins, short_tmp
):
    with plugins.registered(tp, tp.HERE):
        planned = _planned(plugins, short_tmp)
        assert [p.name for p in planned.plan.processes] == ["split_tp0", "split_tp1"]
        async with planned.runtime() as runtime:
            x = [0.5, -1.0, 2.0, 0.25, 1.5, -0.75, 0.0, 3.0]
            first = await runtime.run({"x": x})
            assert first["split"]["y"] == pytest.approx(first["split"]["full"], rel=1e-5)
            stores = sorted(os.listdir(planned.plan.endpoints.runtime_dir))
            assert [s for s in stores if s.startswith("tp-")] == ["tp-split-r0-g1.store"]

            os.kill(runtime.children["split_tp1"].proc.pid, signal.SIGKILL)
            with anyio.fail_after(120):
                while not _restarted(runtime.health()):
                    await anyio.sleep(0.1)
            processes = runtime.health()["processes"]
            assert processes["split_tp0"]["restarts"] == processes["split_tp1"]["restarts"] == 1
            assert "split_tp1 was killed by SIGKILL" in processes["split_tp0"]["last_exit"]
            again = await runtime.run({"x": x})
            assert again["split"]["y"] == first["split"]["y"]
            assert again["split"]["pid"] != first["split"]["pid"]  # a new rank 0
            stores = os.listdir(planned.plan.endpoints.runtime_dir)
            assert "tp-split-r0-g2.store" in stores  # the new group met at a new rendezvous
        assert not os.path.exists(planned.plan.endpoints.runtime_dir)


async def test_a_rank_that_fails_to_start_is_named_and_its_group_is_stopped_at_once(
    plugins, short_tmp
):
    flags = ("--split.factory.fail_rank", "1", "--runtime.startup_timeout", "120")
    with plugins.registered(tp, tp.HERE):
        runtime = _planned(plugins, short_tmp, *flags).runtime()
        started = time.monotonic()
        with pytest.raises(StartupError) as caught:
            async with runtime:
                pass
        elapsed = time.monotonic() - started
    message = caught.value.render()
    assert "process split_tp1 failed to start" in message
    assert "RuntimeError: rank 1 cannot load its shard" in message
    assert (
        "process split_tp0 was stopped: rank 1 (split_tp1) of its tensor-parallel group "
        "failed to start" in message
    )
    # Rank 0 was waiting for rank 1 in Mirror.setup: without being stopped it would have
    # waited the whole startup timeout.
    assert elapsed < 60


async def test_rank_processes_are_refused_under_another_launcher(plugins, short_tmp):
    from omni_core.errors import NotImplementedYet
    from omni_core.runtime import Runtime

    with plugins.registered(tp, tp.HERE):
        planned = _planned(plugins, short_tmp)
        config = planned.config.model_copy(
            update={"runtime": planned.config.runtime.model_copy(update={"launcher": "ray"})}
        )
        with pytest.raises(NotImplementedYet, match="split_tp0, split_tp1"):
            Runtime(planned.plan, config, plugins=plugins)
