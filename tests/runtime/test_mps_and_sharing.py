"""MPS daemons per GPU (with a stand-in for nvidia-cuda-mps-control) and the
clear refusal of weight sharing where a launcher may run processes elsewhere."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import omni_test_pipelines as tp

from omni_core.config import load_deployment
from omni_core.errors import NotImplementedYet
from omni_core.plan import plan_deployment
from omni_core.runtime import Runtime

# The daemon cannot exist without a GPU: this stand-in records what it is asked.
FAKE_CONTROL = """#!/bin/sh
if [ "$1" = "-d" ]; then
  echo "start gpu=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$MPS_RECORD"
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
else
  read command
  echo "$command gpu=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$MPS_RECORD"
fi
"""


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(FAKE_CONTROL)
    control.chmod(control.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "mps.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_RECORD", str(record))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    return record


def _runtime(plugins, short_tmp, *flags):
    resolution = load_deployment(
        None,
        [
            "--endpoints.base_path",
            str(short_tmp),
            "--gpus",
            "1",
            "--gpu-memory",
            "1GiB",
            "--env.gpu",
            "0",
            *flags,
        ],
        pipeline="t-env",
        plugins=plugins,
    )
    plan = plan_deployment(resolution.config, plugins=plugins)
    return Runtime(plan, resolution.config, plugins=plugins, plugin_modules=[tp.HERE])


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mps_on_starts_a_daemon_per_gpu_and_points_clients_at_it(
    plugins, short_tmp, fake_mps, anyio_backend
):
    with plugins.registered(tp, tp.HERE):
        runtime = _runtime(plugins, short_tmp, "--mps", "on")
        async with runtime:
            pipe = runtime.mps[0].pipe_dir
            outputs = await runtime.run({"names": ["CUDA_MPS_PIPE_DIRECTORY"]})
        assert outputs["env"] == {"CUDA_MPS_PIPE_DIRECTORY": pipe}
    lines = fake_mps.read_text().splitlines()
    assert lines == [f"start gpu=0 pipe={pipe}", f"quit gpu=0 pipe={pipe}"]
    assert not os.path.exists(pipe)  # the runtime directory is gone


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mps_off_starts_nothing(plugins, short_tmp, fake_mps, anyio_backend):
    with plugins.registered(tp, tp.HERE):
        runtime = _runtime(plugins, short_tmp, "--mps", "off")
        async with runtime:
            outputs = await runtime.run({"names": ["CUDA_MPS_PIPE_DIRECTORY"]})
    assert outputs["env"] == {"CUDA_MPS_PIPE_DIRECTORY": None}
    assert not fake_mps.exists()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_missing_control_binary_fails_the_start_clearly(
    plugins, tmp_path, short_tmp, monkeypatch, anyio_backend
):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with plugins.registered(tp, tp.HERE):
        runtime = _runtime(plugins, short_tmp, "--mps", "on", "--cluster.mps_available", "true")
        with pytest.raises(Exception, match="nvidia-cuda-mps-control is not on PATH"):
            async with runtime:
                pass  # pragma: no cover
    assert not os.path.exists(runtime.plan.endpoints.runtime_dir)


def test_weight_sharing_is_refused_with_a_launcher_that_may_run_elsewhere(plugins, short_tmp):
    resolution = load_deployment(
        str(Path(__file__).resolve().parents[2] / "examples" / "qwen3_tts_two_replicas.toml"),
        ["--endpoints.base_path", str(short_tmp), "--runtime.launcher", "ray"],
        plugins=plugins,
    )
    plan = plan_deployment(resolution.config, plugins=plugins)
    assert plan.weight_share.groups  # planned: pipeline@r0 leads
    with pytest.raises(NotImplementedYet, match="not implemented yet for launcher 'ray'") as info:
        Runtime(plan, resolution.config, plugins=plugins)
    assert 'weight_share = "off"' in info.value.hint
