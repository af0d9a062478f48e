"""The CONTRIBUTING.md walk-through plugin (examples/plugin), exercised end to end.

Registered in-process (as a test would, without installing it); the spawned
children load it by module name. Every piece the walk-through writes is used:
the pipeline and its factories, the placement policy, the transport.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import tomli

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugin"
sys.path.insert(0, str(EXAMPLE))

import omni_hello.plugin as hello  # noqa: E402

from omni_core.config import load_deployment  # noqa: E402
from omni_core.plan import plan_deployment  # noqa: E402
from omni_core.runtime import Runtime  # noqa: E402


@pytest.fixture
def hello_plugins(plugins):
    with plugins.registered(hello, "omni_hello.plugin"):
        yield plugins


def test_the_distribution_declares_its_entry_point():
    project = tomli.loads((EXAMPLE / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["omni"] == {"hello": "omni_hello.plugin"}


def test_listing_shows_what_the_plugin_registers(hello_plugins):
    (row,) = [r for r in hello_plugins.listing() if r["name"] == "omni_hello.plugin"]
    assert row["pipelines"] == ["hello"]
    assert row["placement_policies"] == ["spread-replicas"]
    assert row["transports"] == ["traced"]
    assert row["hooks"] == [
        "omni_register_pipelines",
        "omni_register_placement_policies",
        "omni_register_transports",
    ]


def _resolve(plugins, *flags):
    return load_deployment(str(EXAMPLE / "hello.toml"), list(flags), plugins=plugins)


def test_the_policy_spreads_replicas_over_the_gpus(hello_plugins):
    plan = plan_deployment(_resolve(hello_plugins).config, plugins=hello_plugins)
    assert plan.policy == "spread-replicas"
    placed = {s.instance: s.gpus for s in plan.stages}
    assert placed == {"greet": (), "shout@r0": (0,), "shout@r1": (1,)}


def test_the_policy_refuses_without_a_gpu_inventory(hello_plugins):
    from omni_core.errors import ConfigError

    with pytest.raises(ConfigError, match="spread-replicas needs to know the GPUs"):
        plan_deployment(
            _resolve(hello_plugins, "--cluster.gpus", "none").config, plugins=hello_plugins
        )


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_requests_run_through_both_replicas_and_the_traced_transport(
    hello_plugins, tmp_path, short_tmp, monkeypatch, anyio_backend
):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("OMNI_HELLO_TRACE", str(trace))
    resolution = _resolve(hello_plugins, "--endpoints.base_path", str(short_tmp))
    plan = plan_deployment(resolution.config, plugins=hello_plugins)
    runtime = Runtime(
        plan, resolution.config, plugins=hello_plugins, plugin_modules=["omni_hello.plugin"]
    )
    async with runtime:
        results = [(await runtime.run({"name": name}))["shout"] for name in ("ada", "alan")]
    assert [r["text"] for r in results] == ["HELLO, ADA!!", "HELLO, ALAN!!"]
    assert {r["gpu_id"] for r in results} == {0, 1}  # least-loaded binding used both replicas
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    sent = [r for r in records if r["direction"] == "out"]
    assert [(r["kind"], r["source"], r["target"]) for r in sent] == [
        ("deliver", "greet", "shout"),
        ("deliver", "greet", "shout"),
    ]
