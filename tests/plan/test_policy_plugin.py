"""A placement policy from a plugin: registered in-process, chosen by a deploy file.

The plugin below is what a third party would ship: a module (here a class
namespace) with one ``omni_register_placement_policies`` hook returning a
:class:`PlacementPolicy`. It spreads the replicas of each process over the
GPUs with the most free memory (as NVML reports it at planning time), and
keeps declared memory shares.
"""

from __future__ import annotations

import pytest

from omni_core import PlacementPolicy, hookimpl
from omni_core.config import load_deployment
from omni_core.errors import ConfigError
from omni_core.plan import (
    Assignment,
    GpuDevice,
    GpuInventory,
    PlacementRequest,
    PlacementResult,
    plan_deployment,
)
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

GiB = 1024**3


class SpreadByFreeMemory(PlacementPolicy):
    name = "spread-free"
    description = "replicas of a process on the GPUs with the most free memory"

    def place(self, request: PlacementRequest) -> PlacementResult:
        result = PlacementResult()
        devices = request.inventory.devices
        if not devices or any(d.free_bytes is None for d in devices):
            result.refuse("spread-free needs each GPU's free memory (detected through NVML)")
            return result
        ranked = sorted(devices, key=lambda d: (-(d.free_bytes or 0), d.index))
        for instance in request.instances:
            gpus = (ranked[instance.replica % len(ranked)].index,) if instance.uses_gpu else ()
            result.assign(
                Assignment(
                    instance.name,
                    gpus,
                    instance.gpu_memory_fraction,
                    instance.total_reserve_bytes,
                    "declared" if instance.declares_share else "none",
                )
            )
        return result


class SpreadPlugin:
    @staticmethod
    @hookimpl
    def omni_register_placement_policies():
        return [SpreadByFreeMemory()]


INVENTORY = GpuInventory(
    devices=(
        GpuDevice(0, 80 * GiB, free_bytes=5 * GiB),
        GpuDevice(1, 80 * GiB, free_bytes=70 * GiB),
        GpuDevice(2, 80 * GiB, free_bytes=40 * GiB),
    ),
    count_known=True,
    source="nvml",
)


@pytest.fixture
def spread(plugins):
    with plugins.registered(SpreadPlugin, name="spread-plugin"):
        yield plugins


def test_plugin_policy_is_listed(spread):
    (row,) = [r for r in spread.listing() if r["name"] == "spread-plugin"]
    assert row["placement_policies"] == ["spread-free"]


def test_plugin_policy_chosen_by_config(spread):
    config = Qwen3TTSPipeline(
        placement={"policy": "spread-free"}, processes={"pipeline": {"num_replicas": 2}}
    )
    plan = plan_deployment(config, INVENTORY, plugins=spread)
    assert plan.policy == "spread-free"
    assert [(p.name, p.gpu) for p in plan.processes] == [("pipeline@r0", 1), ("pipeline@r1", 2)]


def test_plugin_policy_chosen_from_a_deploy_file(spread, tmp_path):
    deploy = tmp_path / "deploy.toml"
    deploy.write_text(
        'pipeline = "qwen3-tts"\n'
        "[placement]\n"
        'policy = "spread-free"\n'
        "[processes.pipeline]\n"
        "num_replicas = 3\n"
    )
    config = load_deployment(str(deploy), [], plugins=spread).config
    plan = plan_deployment(config, INVENTORY, plugins=spread)
    assert [p.gpu for p in plan.processes] == [1, 2, 0]


def test_plugin_policy_results_pass_the_same_checks(spread):
    """Three replicas without shares land on distinct GPUs; two on one GPU are refused."""
    tight = GpuInventory(
        devices=(GpuDevice(0, 80 * GiB, free_bytes=70 * GiB),), count_known=True, source="nvml"
    )
    config = Qwen3TTSPipeline(
        placement={"policy": "spread-free"}, processes={"pipeline": {"num_replicas": 2}}
    )
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, tight, plugins=spread)
    assert "placement policy 'spread-free'" in info.value.message
    assert "processes pipeline@r0, pipeline@r1 each run an engine stage" in info.value.message


def test_plugin_policy_refusal_is_reported(spread):
    config = Qwen3TTSPipeline(placement={"policy": "spread-free"})
    with pytest.raises(ConfigError, match="spread-free needs each GPU's free memory"):
        plan_deployment(config, GpuInventory.uniform(2, 80 * GiB), plugins=spread)


def test_unregistered_after_the_test(plugins):
    from omni_core.errors import PluginError

    with pytest.raises(PluginError, match="no plugin provides a placement policy"):
        plugins.policy("spread-free")


class BothShares(PlacementPolicy):
    """A faulty policy: every GPU stage on GPU 0 with both a fraction and a byte reserve."""

    name = "both-shares"
    description = "sets gpu_memory_fraction and total_reserve_bytes together (refused)"

    def place(self, request: PlacementRequest) -> PlacementResult:
        result = PlacementResult()
        for instance in request.instances:
            if instance.uses_gpu:
                result.assign(Assignment(instance.name, (0,), 0.2, 4 * GiB, "estimate"))
            else:
                result.assign(Assignment(instance.name))
        return result


class BothSharesPlugin:
    @staticmethod
    @hookimpl
    def omni_register_placement_policies():
        return [BothShares()]


def test_a_policy_setting_fraction_and_reserve_is_refused(plugins):
    """The ledger would count only the fraction, so 4 GiB per stage would go unchecked."""
    config = Qwen3TTSPipeline(placement={"policy": "both-shares"})
    with (
        plugins.registered(BothSharesPlugin, name="both-shares-plugin"),
        pytest.raises(ConfigError) as info,
    ):
        plan_deployment(config, GpuInventory.uniform(1, 80 * GiB), plugins=plugins)
    message = info.value.message
    assert "placement policy 'both-shares': 2 problems" in message
    for name in ("tts_engine", "vocoder"):
        assert (
            f"stage {name!r}: the policy gave it both a memory fraction (0.2) and a byte "
            "reserve (4GiB); an assignment promises one or the other"
        ) in message
