"""Planning across nodes: ``[[cluster.nodes]]``, node pins, strategies and cross-node links."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from omni_core import hookimpl
from omni_core.cli import main
from omni_core.errors import ConfigError
from omni_core.launcher import Launcher
from omni_core.placement import ClusterNode, GpuDevice, GpuInventory
from omni_core.plan import plan_deployment
from omni_core.plan.inventory import inventory_for, inventory_from_cluster
from omni_core.runtime.links import Links
from omni_qwen3_omni.pipeline import Qwen3OmniSpeechPipeline
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

GiB = 1024**3
EXAMPLES = Path(__file__).parents[2] / "examples"
TWO_NODES = [
    {"name": "a", "gpus": 1, "gpu_memory": 141 * GiB},
    {"name": "b", "gpus": 1, "gpu_memory": 141 * GiB},
]


def omni(**fields):
    config = Qwen3OmniSpeechPipeline(cluster={"nodes": TWO_NODES}, **fields)
    return config, inventory_from_cluster(config.cluster)


def where(plan) -> dict[str, tuple[str | None, int | None]]:
    return {p.name: (p.node, p.node_gpu) for p in plan.processes}


def test_the_seed_qwen3_omni_plan_is_placed_across_two_nodes(plugins):
    config, inventory = omni()
    plan = plan_deployment(config, inventory, plugins)
    # GPU ids count the nodes' GPUs in node order: GPU 1 is node b's GPU 0.
    assert where(plan) == {
        "preprocessing": ("a", None),
        "image_encoder": ("a", 0),
        "audio_encoder": ("a", 0),
        "thinker": ("a", 0),
        "decode": ("a", None),
        "talker_ar": ("b", 0),
        "code2wav": ("a", 0),
    }
    nodes = plan.to_dict()["nodes"]
    assert nodes["coordinator"] == "a"
    assert [n["processes"] for n in nodes["nodes"]][1] == ["talker_ar"]
    links = {(e.source, e.target): {k.transport for k in e.links} for e in plan.edges}
    assert links[("thinker", "talker_ar")] == {"tcp"}  # crosses nodes
    assert links[("talker_ar", "code2wav")] == {"tcp"}
    assert links[("preprocessing", "thinker")] == {"shm"}  # stays on node a
    edge = next(e for e in plan.to_dict()["edges"] if e["target"] == "talker_ar")
    assert edge["transport"] == "tcp"
    assert edge["links"] == [
        {"source": "thinker", "target": "talker_ar", "transport": "tcp", "cross_node": True}
    ]


def test_omni_plan_json_gives_every_process_its_node(tmp_path, capsys, plugins):
    deploy = tmp_path / "deploy.toml"
    deploy.write_text(
        'pipeline = "qwen3-omni"\n'
        '[[cluster.nodes]]\nname = "a"\ngpus = 1\ngpu_memory = "141GiB"\n'
        '[[cluster.nodes]]\nname = "b"\ngpus = 1\ngpu_memory = "141GiB"\n'
    )
    assert main(["plan", str(deploy), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {p["name"]: p["node"] for p in data["processes"]}["talker_ar"] == "b"
    assert all(p["node"] in ("a", "b") for p in data["processes"])
    assert main(["plan", str(deploy), "--no-detect"]) == 0
    text = capsys.readouterr().out
    assert "on 2 nodes (a: 1, b: 1)" in text
    [talker] = [line for line in text.splitlines() if line.startswith("│ talker_ar")]
    assert "b: GPU 0" in talker  # its node, and the GPU's id on that node


def test_spread_strategy_puts_host_processes_on_the_emptier_node(plugins):
    config, inventory = omni(ray={"strategy": "spread"})
    placed = where(plan_deployment(config, inventory, plugins))
    # GPU processes stay with their GPUs; the CPU ones go where fewer processes are.
    assert placed["preprocessing"][0] == "b"
    assert placed["decode"][0] == "b"


def test_a_pin_moves_a_host_process_and_an_unknown_node_is_refused(plugins):
    config, inventory = omni(processes={"decode": {"node": "b"}})
    assert where(plan_deployment(config, inventory, plugins))["decode"] == ("b", None)
    config, inventory = omni(processes={"decode": {"node": "bb"}})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, inventory, plugins)
    assert "processes.decode.node names 'bb', which is not a node" in info.value.message
    assert "did you mean: b" in info.value.render()


def test_a_pin_that_contradicts_the_gpu_is_refused_with_the_nodes_gpus(plugins):
    config, inventory = omni(processes={"thinker": {"node": "b"}})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, inventory, plugins)
    text = info.value.render()
    assert "pinned to node 'b' but its GPU 0 is on node 'a'" in text
    assert "choose a GPU of node 'b' (GPU 1)" in text


def test_tensor_parallel_ranks_on_two_nodes_are_refused(plugins):
    config = Qwen3OmniSpeechPipeline(
        cluster={"nodes": TWO_NODES},
        stages=[
            s.model_copy(update={"tp_size": 2, "gpu": [0, 1]}) if s.name == "thinker" else s
            for s in Qwen3OmniSpeechPipeline.default_stages()
        ],
    )
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, inventory_from_cluster(config.cluster), plugins)
    assert "tensor-parallel ranks of process 'thinker'" in info.value.render()
    assert "must share a node" in info.value.render()


def test_a_node_without_cpus_for_its_processes_is_refused(plugins):
    nodes = [{**TWO_NODES[0], "cpus": 2}, TWO_NODES[1]]
    config = Qwen3OmniSpeechPipeline(cluster={"nodes": nodes})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, inventory_from_cluster(config.cluster), plugins)
    assert "node 'a' has 2 CPUs but its 6 processes reserve 6" in info.value.render()


def test_a_host_only_transport_between_nodes_is_refused(plugins):
    config, inventory = omni(runtime={"cross_node_transport": "shm"})
    with pytest.raises(ConfigError) as info:
        plan_deployment(config, inventory, plugins)
    text = info.value.render()
    assert "runtime.cross_node_transport 'shm' cannot leave its host" in text
    assert "thinker->talker_ar" in text
    assert 'runtime.cross_node_transport = "tcp"' in text


def test_links_route_across_nodes_by_tcp_and_within_a_node_by_unix_socket(plugins):
    config, inventory = omni()
    plan = plan_deployment(config, inventory, plugins)
    addresses = {p.name: f"tcp://10.0.0.{i}:7000" for i, p in enumerate(plan.processes)}
    links = Links(plan, config, {**addresses, "coordinator": "tcp://10.0.0.99:7000"})
    assert links.route("thinker", "talker_ar", ("thinker", "talker_ar")) == (
        "tcp",
        addresses["talker_ar"],
    )
    transport, address = links.route("preprocessing", "thinker", ("preprocessing", "thinker"))
    assert (transport, address.startswith("unix:")) == ("shm", True)
    # talker_ar hears the coordinator and the thinker across nodes, so it listens on TCP too.
    heard = dict(links.listens("talker_ar", ["talker_ar"]))
    assert heard["tcp"] == addresses["talker_ar"]
    assert heard["shm"].startswith("unix:")
    # The coordinator hears talker_ar (node b) by TCP; the others by its Unix socket.
    assert links.route("talker_ar", None) == ("tcp", "tcp://10.0.0.99:7000")
    assert links.route("thinker", None)[0] == "shm"
    assert "tcp" not in dict(links.listens("thinker", ["thinker"]))


def test_without_reserved_addresses_a_cross_node_route_says_which_launcher_can(plugins):
    config, inventory = omni()
    links = Links(plan_deployment(config, inventory, plugins), config)
    with pytest.raises(RuntimeError, match=re.escape('runtime.launcher = "ray"')):
        links.route("thinker", "talker_ar", ("thinker", "talker_ar"))


def test_one_host_plans_have_no_nodes(plugins):
    plan = plan_deployment(Qwen3TTSPipeline(), plugins=plugins)
    assert plan.nodes is None
    assert plan.to_dict()["nodes"] is None
    assert all(p.node is None for p in plan.processes)


def test_the_ray_example_splits_the_demo_across_two_nodes(capsys, plugins):
    assert main(["plan", str(EXAMPLES / "qwen3_tts_ray.toml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {p["name"]: p["node"] for p in data["processes"]} == {
        "preprocessing": "a",
        "tts_engine": "a",
        "vocoder": "b",
    }
    assert {(e["source"], e["target"]): e["transport"] for e in data["edges"]} == {
        ("preprocessing", "tts_engine"): "shm",
        ("tts_engine", "vocoder"): "tcp",
    }


class _SeenCluster(Launcher):
    """A launcher plugin that sees a cluster (what ``ray`` answers with --ray-address)."""

    name = "seen"

    def inventory(self, config):
        return GpuInventory(
            (GpuDevice(0), GpuDevice(1)),
            True,
            None,
            "seen",
            (),
            (ClusterNode("head", 1, 0), ClusterNode("worker", 1, 1)),
        )

    def session(self, plan, config):
        raise AssertionError("planning never starts anything")


class _SeenClusterPlugin:
    @hookimpl
    def omni_register_launchers(self):
        return [_SeenCluster()]


def test_a_launcher_that_sees_a_cluster_is_planned_against_with_declared_memory(plugins):
    plugins.register(_SeenClusterPlugin(), name="seen-cluster")
    config = Qwen3OmniSpeechPipeline(runtime={"launcher": "seen"}, cluster={"gpu_memory": "80GiB"})
    inventory = inventory_for(config, plugins)
    assert [n.name for n in inventory.nodes] == ["head", "worker"]
    assert inventory.source == "seen+config"
    assert {d.memory_bytes for d in inventory.devices} == {80 * GiB}  # Ray reports no memory
    placed = where(plan_deployment(config, inventory, plugins))
    assert placed["talker_ar"] == ("worker", 0)
    # Without detection the deploy file alone is planned against (here: one host).
    assert inventory_for(config, plugins, detect=False).nodes == ()
