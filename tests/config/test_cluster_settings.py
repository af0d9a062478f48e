"""The multi-node settings: ``[[cluster.nodes]]``, ``[ray]``, ``runtime.launcher``, node pins."""

from __future__ import annotations

import tomli

TWO_NODES = """\
pipeline = "qwen3-omni"

[[cluster.nodes]]
name = "a"
gpus = 1
gpu_memory = "141GiB"

[[cluster.nodes]]
name = "b"
gpus = 2

[processes.decode]
node = "b"
"""


def test_declared_nodes_resolve_and_the_resolved_file_reads_back(deploy, cli, tmp_path):
    code, out, err = cli("config", "resolve", deploy(TWO_NODES))
    assert code == 0, err
    doc = tomli.loads(out)
    assert doc["cluster"]["nodes"] == [
        {"name": "a", "gpus": 1, "gpu_memory": 141 * 1024**3},
        {"name": "b", "gpus": 2},  # unset keys are left out: TOML has no null
    ]
    assert doc["processes"]["decode"]["node"] == "b"
    again = tmp_path / "resolved.toml"
    again.write_text(out)
    code, out_again, err = cli("config", "resolve", str(again))
    assert code == 0, err
    assert tomli.loads(out_again)["cluster"] == doc["cluster"]


def test_ray_address_and_launcher_have_short_flags(deploy, resolve):
    resolution = resolve(deploy(TWO_NODES), "--ray-address", "10.0.0.1:6379", "--launcher", "ray")
    assert resolution.config.ray.address == "10.0.0.1:6379"
    assert resolution.config.runtime.launcher == "ray"
    assert resolution.config.ray.strategy == "pack"


def test_an_unknown_launcher_exits_2_naming_the_flag_and_the_choices(deploy, cli):
    code, _, err = cli("plan", deploy(TWO_NODES), "--launcher", "rey")
    assert code == 2
    assert "no plugin provides a launcher called 'rey' (set by --launcher)" in err
    assert "registered launchers: local, ray" in err
    assert "Traceback" not in err


def test_bad_node_tables_are_refused_with_their_line(deploy, cli):
    code, _, err = cli(
        "config",
        "resolve",
        deploy('pipeline = "qwen3-omni"\n[[cluster.nodes]]\nname = "a b"\n'),
    )
    assert code == 2
    assert "node name 'a b' must be letters, digits" in err
    code, _, err = cli(
        "config",
        "resolve",
        deploy('pipeline = "qwen3-omni"\n[cluster]\ngpus = 2\n[[cluster.nodes]]\nname = "a"\n'),
    )
    assert code == 2
    assert "with nodes, give each node its gpus" in err
    node = '[[cluster.nodes]]\nname = "a"\n'
    twice = 'pipeline = "qwen3-omni"\n' + node + node
    code, _, err = cli("config", "resolve", deploy(twice))
    assert code == 2
    assert "the name 'a' is used twice" in err


def test_a_ray_strategy_outside_the_choices_is_refused(deploy, cli):
    code, _, err = cli("config", "resolve", deploy(TWO_NODES), "--ray.strategy", "scatter")
    assert code == 2
    assert "--ray.strategy" in err
    assert "'pack', 'spread'" in err


def test_a_process_table_for_a_process_the_file_creates_is_accepted(deploy, resolve):
    """A deploy file may name a process it creates with ``[stages.X] process``."""
    text = (
        'pipeline = "qwen3-tts"\n[stages.vocoder]\nprocess = "voc"\n'
        "[processes.voc]\nnum_replicas = 2\n"
    )
    resolution = resolve(deploy(text))
    assert resolution.config.processes["voc"].num_replicas == 2


def test_the_local_launcher_refuses_a_plan_that_leaves_its_host(plugins):
    import anyio

    from omni_core.errors import ConfigError
    from omni_core.plan import plan_deployment
    from omni_core.plan.inventory import inventory_from_cluster
    from omni_core.runtime.launchers.local import LocalSession
    from omni_qwen3_omni.pipeline import Qwen3OmniSpeechPipeline

    config = Qwen3OmniSpeechPipeline(
        cluster={"nodes": [{"name": "a", "gpus": 1}, {"name": "b", "gpus": 1}]}
    )
    plan = plan_deployment(config, inventory_from_cluster(config.cluster), plugins)
    try:
        anyio.run(LocalSession(plan).open)
    except ConfigError as exc:
        assert "places processes on node b" in exc.message
        assert 'runtime.launcher = "ray"' in (exc.hint or "")
    else:
        raise AssertionError("the local launcher accepted a two-node plan")


def test_the_ray_launcher_without_a_cluster_says_how_to_name_one(deploy, resolve, monkeypatch):
    from omni_core.errors import OmniError
    from omni_core.runtime.launchers import ray as ray_launcher

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = resolve(deploy(TWO_NODES), "--launcher", "ray").config
    assert ray_launcher.RayLauncher().inventory(config) is None  # plan offline, from the file
    try:
        ray_launcher.connect(config)
    except OmniError as exc:
        assert "names no cluster" in exc.message
        assert "--ray-address" in (exc.hint or "")
        assert exc.exit_code == 2  # a configuration error
    else:
        raise AssertionError("connect() joined a cluster nobody named")


def test_an_unreachable_cluster_is_refused_in_seconds_naming_the_address(deploy, resolve):
    import socket
    import time

    from omni_core.runtime.launchers import ray as ray_launcher

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    config = resolve(deploy(TWO_NODES), "--ray-address", address).config
    started = time.monotonic()
    try:
        ray_launcher.connect(config)
    except ray_launcher.RayUnavailable as exc:
        assert f"cannot reach the Ray cluster at {address}" in exc.message
        assert exc.exit_code == 1  # the deploy file may be right; the cluster is not there
    else:
        raise AssertionError("connect() joined a cluster at a closed port")
    assert time.monotonic() - started < 10  # ray.init alone retries for minutes
