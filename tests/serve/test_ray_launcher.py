"""The Ray launcher on a real two-node Ray cluster on this machine.

``ray.cluster_utils.Cluster`` starts a head node labelled ``omni-node = a``
and a second node labelled ``b`` (two raylets, two object stores: Ray
schedules them as two machines). ``omni serve examples/qwen3_tts_ray.toml``
then runs the demo as three process groups: preprocessing and the engine on
node a, the vocoder on node b. The tests talk to it with the ``openai``
client and look at the cluster through Ray's state API.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import OmniServe, raw

ray = pytest.importorskip("ray")
pytest.importorskip("omni_qwen3_tts")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util import state  # noqa: E402

from omni_core.sigterm import signal_handlers_kept  # noqa: E402
from omni_core.testing import local_ray_cluster, short_private_dir  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3_tts_ray.toml"
SPEECH = {"input": "Hello from two nodes", "voice": "serena", "seed": 11, "max_frames": 40}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    head = {"num_cpus": 4, "labels": {"omni-node": "a"}, "include_dashboard": True}
    with local_ray_cluster(head, {"num_cpus": 4, "labels": {"omni-node": "b"}}) as nodes:
        try:
            # the test's own view of it
            with signal_handlers_kept():  # else SIGTERM would sys.exit mid-test, no cleanup
                joined = ray.init(address=nodes.address, log_to_driver=False)
            # the session (logs) in the cluster's private TMPDIR, removed with it
            assert "/omni-ray-" in joined.address_info["session_dir"]
            yield nodes
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def served(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServe]:
    server = OmniServe(
        tmp_path_factory.mktemp("ray-serve"),
        EXAMPLE,
        ("--ray-address", cluster.address, "--runtime.restart_backoff", "0.2"),
        timeout=240,
    )
    try:
        yield server
    finally:
        server.stop()


def health(server: OmniServe) -> dict[str, Any]:
    return raw("GET", f"{server.url}/health").json()


def speak(server: OmniServe, **body: Any) -> bytes:
    reply = server.client().audio.speech.create(
        model="tiny",
        input=body.pop("input"),
        voice=body.pop("voice"),
        response_format="wav",
        extra_body=body,
    )
    return reply.content


def omni_actors() -> list[Any]:
    return [a for a in state.list_actors() if (a.name or "").startswith("omni-")]


@pytest.mark.slow
def test_the_demo_split_across_nodes_speaks_as_the_local_launcher_does(served, tmp_path_factory):
    audio = speak(served, **SPEECH)
    assert audio[:4] == b"RIFF" and len(audio) > 1000
    local = OmniServe(
        tmp_path_factory.mktemp("local"),  # short: socket paths have a length limit
        EXAMPLE,
        ("--launcher", "local", "--cluster.nodes", "[]"),
        timeout=120,
    )
    try:
        assert speak(local, **SPEECH) == audio  # same seed, same bytes, either launcher
    finally:
        assert local.stop() == 0, local.stderr()


@pytest.mark.slow
def test_each_process_runs_on_its_planned_node_over_the_planned_transports(served):
    speak(served, **SPEECH)
    time.sleep(1.5)  # one heartbeat brings the counts
    processes = health(served)["processes"]
    assert {name: p["node"] for name, p in processes.items()} == {
        "preprocessing": "a",
        "tts_engine": "a",
        "vocoder": "b",
    }
    nodes = {n["node_id"]: n["labels"].get("omni-node") for n in _nodes()}
    for name, process in processes.items():
        assert nodes[process["node_id"]] == process["node"]  # where Ray really put it
        assert process["actor"].endswith(f"-{name}")
    # What ran: the engine heard preprocessing (and the coordinator) over shm only;
    # the vocoder, on the other node, heard the engine over tcp only.
    assert set(processes["tts_engine"]["received"]) == {"shm"}
    assert set(processes["vocoder"]["received"]) == {"tcp"}
    assert processes["vocoder"]["received"]["tcp"] > 0


@pytest.mark.slow
def test_a_killed_actor_fails_its_requests_and_its_group_comes_back(served):
    before = health(served)["processes"]["vocoder"]
    replies: list[Any] = []

    def long_request(seed: int) -> None:
        body = {**SPEECH, "input": "a much longer sentence " * 8, "max_frames": 200, "seed": seed}
        replies.append(raw("POST", f"{served.url}/v1/audio/speech", json_body=body, timeout=120))

    # Several at once keep the vocoder busy well past the moment the kill lands. The demo's
    # random weights end some seeds' audio in a second; these speak 8-9 s each.
    workers = [threading.Thread(target=long_request, args=(s,)) for s in (2, 4, 5, 6)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the vocoder is working on them
        queue = health(served)["processes"]["vocoder"]["queue"].get("vocoder", {})
        if queue.get("running"):
            break
        time.sleep(0.05)
    ray.kill(ray.get_actor(before["actor"], namespace="omni"), no_restart=True)
    for worker in workers:
        worker.join(120)
    failed = [r for r in replies if r.status_code != 200]
    assert failed, "every request finished before the actor died"
    for reply in failed:
        assert reply.status_code in (500, 503), reply.content[:200]
        assert "vocoder" in reply.json()["error"]["message"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        after = health(served)["processes"]["vocoder"]
        if after["state"] == "healthy" and after["restarts"] > before["restarts"]:
            break
        time.sleep(0.2)
    assert after["state"] == "healthy" and after["restarts"] == before["restarts"] + 1
    assert after["node"] == "b"  # restarted in its bundle, on the node that fits
    assert speak(served, **SPEECH)[:4] == b"RIFF"  # new requests succeed


@pytest.mark.slow
def test_stopping_omni_serve_leaves_no_actor_and_no_placement_group(cluster, tmp_path_factory):
    server = OmniServe(
        tmp_path_factory.mktemp("stop"), EXAMPLE, ("--ray-address", cluster.address), timeout=240
    )
    try:
        assert speak(server, **SPEECH)[:4] == b"RIFF"
        names = {p["actor"] for p in health(server)["processes"].values()}
        # omni-<deployment>-<run>-<process>: the group is omni-<deployment>-<run>.
        [group] = {name.rsplit("-", 1)[0] for name in names}
        alive = {a.name for a in omni_actors() if a.state == "ALIVE"}
        assert names <= alive
    finally:
        assert server.stop() == 0, server.stderr()
    assert "Traceback" not in server.stderr()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = [a.name for a in omni_actors() if a.state != "DEAD" and a.name in names]
        groups = [
            g.name
            for g in state.list_placement_groups()
            if g.name == group and g.state != "REMOVED"
        ]
        if not left and not groups:
            break
        time.sleep(0.2)
    assert left == [] and groups == []
    assert any(g.name == group for g in state.list_placement_groups())  # it did exist


def test_omni_plan_against_the_live_cluster_names_its_nodes(cluster, tmp_path):
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "omni_core",
            "plan",
            str(EXAMPLE),
            "--json",
            "--ray-address",
            cluster.address,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["inventory"]["source"] == "ray"
    live = {n["name"]: n["node_id"] for n in plan["inventory"]["nodes"]}
    assert set(live) == {"a", "b"}
    assert all(len(node_id) == 56 for node_id in live.values())  # Ray's own node ids
    assert {p["name"]: p["node"] for p in plan["processes"]}["vocoder"] == "b"


def _nodes() -> list[dict[str, Any]]:
    return [{"node_id": n["NodeID"], "labels": n.get("Labels", {})} for n in ray.nodes()]


@pytest.mark.slow
def test_start_local_runs_the_one_host_demo_on_a_cluster_of_its_own(tmp_path_factory, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    demo = EXAMPLE.parent / "qwen3_tts_demo.toml"
    # the cluster's session (logs) stays under $TMPDIR/ray, as any Ray cluster's: a private one
    with short_private_dir("omni-ray-") as scratch:
        server = OmniServe(
            tmp_path_factory.mktemp("local-ray"),
            demo,
            ("--launcher", "ray", "--ray.start_local", "true", "--ray.namespace", "omni-own"),
            timeout=240,
            env={"TMPDIR": str(scratch)},
        )
        try:
            processes = health(server)["processes"]
            assert processes["pipeline"]["actor"].startswith("omni-qwen3-tts-")
            assert speak(server, **SPEECH)[:4] == b"RIFF"
        finally:
            assert server.stop() == 0, server.stderr()
        assert "Traceback" not in server.stderr()
        assert (scratch / "ray").is_dir()  # where Ray kept the session


@pytest.mark.slow
def test_omni_serve_stops_cleanly_after_its_cluster_is_gone(short_tmp):
    """The head node dies, then the operator stops omni: it must not wait on Ray forever
    (removing a placement group retries a lost GCS for minutes)."""
    nodes_of = (
        {"num_cpus": 4, "labels": {"omni-node": "a"}},
        {"num_cpus": 4, "labels": {"omni-node": "b"}},
    )
    with local_ray_cluster(*nodes_of) as nodes:
        server = OmniServe(short_tmp, EXAMPLE, ("--ray-address", nodes.address), timeout=240)
        try:
            assert speak(server, **SPEECH)[:4] == b"RIFF"
        except BaseException:
            server.stop()
            raise
    # the cluster is shut down: SIGTERM, and stop() would SIGKILL after 30 s
    assert server.stop() == 0, server.stderr()
    assert "Traceback" not in server.stderr()
