"""The plan as a picture: ``plan_svg`` / ``plan_html`` and ``omni plan --format svg|html``.

The SVG is read back with ``xml.etree`` as any consumer would: it must be
well-formed, name every stage, process and GPU, keep the attributes the
playground paints live state onto, and lay boxes out without overlaps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from omni_core.cli import main
from omni_core.config import load_deployment
from omni_core.plan import GpuInventory, inventory_from_cluster, plan_deployment
from omni_core.plan.picture import gpu_colours, plan_html, plan_svg

from .conftest import TpPipeline

EXAMPLES = Path(__file__).parents[2] / "examples"
QWEN3_OMNI = EXAMPLES / "qwen3_omni.toml"
SVG = "{http://www.w3.org/2000/svg}"
TWO_H200 = ["--no-detect", "--gpus", "2", "--gpu-memory", "141GiB"]


@pytest.fixture(autouse=True)
def _fresh_plugins(plugins):
    """The CLI uses the process-wide manager; the fixture resets it around each test."""
    yield


def _plan(path: Path, *flags: str):
    resolution = load_deployment(str(path), list(flags))
    return plan_deployment(resolution.config, inventory_from_cluster(resolution.config.cluster))


def _texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def _groups(root: ET.Element, kind: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == kind]


def _rect(group: ET.Element) -> tuple[float, float, float, float]:
    rect = group.find(f"{SVG}rect")
    assert rect is not None
    return tuple(float(rect.get(k)) for k in ("x", "y", "width", "height"))  # type: ignore[return-value]


def test_the_seven_process_two_gpu_qwen3_omni_plan_names_every_stage_process_and_gpu():
    plan = _plan(QWEN3_OMNI, "--gpus", "2", "--gpu-memory", "141GiB")
    root = ET.fromstring(plan_svg(plan))
    assert root.tag == f"{SVG}svg"
    texts = _texts(root)
    assert len(plan.processes) == 7
    for process in plan.processes:
        assert process.name in texts
        where = "CPU" if process.gpu is None else f"GPU {process.gpu}"
        (box,) = [g for g in _groups(root, "process") if g.get("data-process") == process.name]
        assert any(t.startswith(where) for t in _texts(box))
    for stage in plan.stages:
        assert stage.instance in texts
    for gpu in (0, 1):
        assert any(t.startswith(f"GPU {gpu} · 141GiB") for t in texts)  # the legend
    title = root.find(f"{SVG}title")
    assert title is not None and title.text == "qwen3-omni: 7 processes on 2 GPUs"


def test_processes_are_coloured_by_gpu_and_the_cpu_is_grey():
    plan = _plan(QWEN3_OMNI, "--gpus", "2", "--gpu-memory", "141GiB")
    root = ET.fromstring(plan_svg(plan))
    fills = {}
    for box in _groups(root, "process"):
        rect = box.find(f"{SVG}rect")
        fills.setdefault(box.get("data-gpu"), set()).add(rect.get("fill"))
    assert fills == {
        "0": {gpu_colours(0)[0]},
        "1": {gpu_colours(1)[0]},
        "cpu": {gpu_colours(None)[0]},
    }
    assert len({gpu_colours(0)[0], gpu_colours(1)[0], gpu_colours(None)[0]}) == 3


def test_edges_carry_their_transport_and_streams_are_dashed():
    plan = _plan(QWEN3_OMNI, "--gpus", "2", "--gpu-memory", "141GiB")
    root = ET.fromstring(plan_svg(plan))
    edges = {(g.get("data-source"), g.get("data-target")): g for g in _groups(root, "edge")}
    assert set(edges) == {(e.source, e.target) for e in plan.edges}
    for edge in plan.edges:
        group = edges[(edge.source, edge.target)]
        path = group.find(f"{SVG}path")
        assert (path.get("stroke-dasharray") is not None) is edge.stream, edge
        assert group.get("data-transport") == (edge.transport or "")
        assert edge.transport in _texts(group)  # between processes: labelled
    assert {e.source for e in plan.edges if e.stream} == {"thinker", "talker_ar"}
    legend = " ".join(_texts(root))
    assert "stream_to" in legend and "transport between processes" in legend


def test_the_playground_finds_every_stage_and_process_by_its_attributes():
    plan = _plan(EXAMPLES / "qwen3_tts_two_replicas.toml")
    root = ET.fromstring(plan_svg(plan))
    stages = _groups(root, "stage")
    assert sorted((g.get("data-process"), g.get("data-instance")) for g in stages) == sorted(
        (s.process, s.instance) for s in plan.stages
    )
    assert {g.get("data-stage") for g in stages} == {"preprocessing", "tts_engine", "vocoder"}
    for group in stages:  # the empty line the page writes queue depth into
        (live,) = [t for t in group.iter(f"{SVG}text") if t.get("class") == "stage-live"]
        assert live.text is None and float(live.get("data-max-width")) > 100
    for box in _groups(root, "process"):
        assert [t.get("class") for t in box.iter(f"{SVG}text")].count("process-live") == 1
    ids = [e.get("id") for e in root.iter() if e.get("id")]
    assert len(ids) == len(set(ids))
    # replicas of one process are not wired to each other
    for edge in _groups(root, "edge"):
        assert edge.get("data-source").split("@")[1] == edge.get("data-target").split("@")[1]


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.stem)
def test_boxes_never_overlap_and_edges_run_left_to_right(example):
    plan = _plan(example)
    root = ET.fromstring(plan_svg(plan))
    boxes = [_rect(g) for g in _groups(root, "process")]
    assert len(boxes) == len(plan.processes)
    for i, (x1, y1, w1, h1) in enumerate(boxes):
        for x2, y2, w2, h2 in boxes[i + 1 :]:
            apart = x1 + w1 <= x2 or x2 + w2 <= x1 or y1 + h1 <= y2 or y2 + h2 <= y1
            assert apart, (example.stem, (x1, y1, w1, h1), (x2, y2, w2, h2))
    width = float(root.get("width"))
    for x, _, w, _ in boxes:
        assert x > 0 and x + w < width
    for edge in _groups(root, "edge"):
        d = edge.find(f"{SVG}path").get("d")
        start = float(d[1:].split(",")[0])
        end = float(d.rsplit(" ", 1)[1].split(",")[0])
        assert start < end, (example.stem, edge.get("data-source"), edge.get("data-target"))


@pytest.mark.parametrize("example", ["qwen3_omni", "qwen3_omni_text"])
def test_an_edge_that_skips_a_column_passes_between_nodes_not_through_them(example):
    """preprocessing -> thinker (between processes) and preprocessing -> mm_aggregate (in one)
    skip the encoders' column: they pass through a slot kept free between the encoders."""
    plan = _plan(EXAMPLES / f"{example}.toml")
    root = ET.fromstring(plan_svg(plan))
    nodes = [_rect(g) for g in _groups(root, "stage")]
    target = "thinker" if example == "qwen3_omni" else "mm_aggregate"
    (edge,) = [
        g
        for g in _groups(root, "edge")
        if (g.get("data-source"), g.get("data-target")) == ("preprocessing", target)
    ]
    d = edge.find(f"{SVG}path").get("d").split()
    via = [tuple(map(float, d[i].split(","))) for i in range(3, len(d) - 1, 3)]
    assert via, d  # it has a point in the encoders' column
    for px, py in via:
        for x, y, w, h in nodes:
            assert not (x <= px <= x + w and y <= py <= y + h), (px, py)


def test_a_multi_node_plan_says_where_each_process_runs_and_labels_each_link():
    plan = _plan(EXAMPLES / "qwen3_tts_ray.toml")
    root = ET.fromstring(plan_svg(plan))
    assert root.find(f"{SVG}title").text.endswith("across 2 nodes")
    boxes = {g.get("data-process"): _texts(g) for g in _groups(root, "process")}
    for process in plan.processes:
        assert f"CPU on {process.node}" in boxes[process.name]
    labels = {
        (g.get("data-source"), g.get("data-target")): g.get("data-transport")
        for g in _groups(root, "edge")
    }
    links = [(e.source, e.target, k.transport) for e in plan.edges for k in e.links]
    assert {"shm", "tcp"} <= {transport for *_, transport in links}
    for source, target, transport in links:
        assert labels[(source, target)] == transport


def test_an_edge_back_into_an_earlier_process_runs_under_the_boxes():
    """decode moved into preprocessing's process: thinker -> decode points backwards."""
    plan = _plan(QWEN3_OMNI, "--gpus", "2", "--gpu-memory", "141GiB")
    processes = [
        dataclasses.replace(p, stages=(*p.stages, "decode")) if p.name == "preprocessing" else p
        for p in plan.processes
        if p.name != "decode"
    ]
    stages = [
        dataclasses.replace(s, process="preprocessing") if s.instance == "decode" else s
        for s in plan.stages
    ]
    root = ET.fromstring(plan_svg(dataclasses.replace(plan, processes=processes, stages=stages)))
    boxes = [_rect(g) for g in _groups(root, "process")]
    bottom = max(y + h for _, y, _, h in boxes)
    (edge,) = [g for g in _groups(root, "edge") if g.get("data-target") == "decode"]
    d = edge.find(f"{SVG}path").get("d")
    lane = [float(p.split(",")[1]) for p in d.split() if p.startswith("L")]
    assert lane and lane[0] > bottom  # along a lane below every box
    assert float(root.get("height")) > lane[0]


def test_tensor_parallel_ranks_stand_beside_their_leader(plugins):
    plan = plan_deployment(TpPipeline(), GpuInventory.uniform(2, 80 * 1024**3), plugins)
    root = ET.fromstring(plan_svg(plan))
    boxes = {g.get("data-process"): _rect(g) for g in _groups(root, "process")}
    assert boxes["big_tp0"][0] == boxes["big_tp1"][0]  # one column
    assert boxes["front"][0] < boxes["big_tp0"][0] < boxes["back"][0]
    ranks = [g for g in _groups(root, "stage") if g.get("data-stage") == "big"]
    assert sorted(g.get("data-process") for g in ranks) == ["big_tp0", "big_tp1"]
    assert "TP rank 1 of 2" in _texts(root)
    # edges attach to the leading rank only
    wired = {(g.get("data-source"), g.get("data-target")) for g in _groups(root, "edge")}
    assert wired == {("front", "big"), ("big", "back")}


def test_text_is_escaped_and_the_drawing_is_deterministic():
    plan = _plan(EXAMPLES / "qwen3_tts_demo.toml")
    odd = dataclasses.replace(plan, pipeline='<b>&"x"</b>', model_path="a<b")
    svg = plan_svg(odd)
    root = ET.fromstring(svg)
    assert root.get("data-pipeline") == '<b>&"x"</b>'
    assert root.find(f"{SVG}title").text.startswith('<b>&"x"</b>: 1 process')
    assert "<b>" not in svg
    assert plan_svg(odd) == svg


def test_the_html_page_is_well_formed_and_lists_the_processes():
    plan = _plan(QWEN3_OMNI, "--gpus", "2", "--gpu-memory", "141GiB")
    root = ET.fromstring(plan_html(plan).split("\n", 1)[1])  # past the doctype
    xhtml = "{http://www.w3.org/1999/xhtml}"
    assert root.find(f".//{SVG}svg") is not None
    rows = root.findall(f".//{xhtml}tbody/{xhtml}tr")
    assert [r[0].text for r in rows] == [p.name for p in plan.processes]
    assert rows[5][1].text == "GPU 1"
    edges = [li.text for li in root.findall(f".//{xhtml}ul/{xhtml}li")]
    assert "thinker → talker_ar: shm, streamed" in edges


# -- omni plan --format / --output ----------------------------------------------------------


def test_omni_plan_format_svg_prints_the_picture(capsys):
    assert main(["plan", str(QWEN3_OMNI), *TWO_H200, "--format", "svg"]) == 0
    out = capsys.readouterr().out
    root = ET.fromstring(out)
    texts = _texts(root)
    for name in ("preprocessing", "image_encoder", "audio_encoder", "thinker", "decode"):
        assert name in texts
    assert {"talker_ar", "code2wav"} <= set(texts)
    assert any(t.startswith("GPU 1") for t in texts)


def test_omni_plan_writes_html_atomically_to_output(tmp_path, capsys):
    target = tmp_path / "plan.html"
    target.write_text("old")
    target.chmod(0o640)
    assert main(["plan", str(QWEN3_OMNI), *TWO_H200, "--format", "html", "-o", str(target)]) == 0
    assert capsys.readouterr().out == ""
    text = target.read_text()
    assert text.startswith("<!DOCTYPE html>") and "</html>" in text
    assert os.stat(target).st_mode & 0o777 == 0o640  # the file's mode is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.html"]  # no temporary left
    fresh = tmp_path / "plan.json"
    args = ["--format", "json", "--output", str(fresh)]
    assert main(["plan", str(QWEN3_OMNI), *TWO_H200, *args]) == 0
    assert json.loads(fresh.read_text())["inventory"]["count"] == 2
    assert os.stat(fresh).st_mode & 0o777 == 0o666 & ~_umask()  # as a plain write makes it


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_json_is_an_alias_of_format_json_and_text_stays_the_default(tmp_path, capsys):
    assert main(["plan", str(QWEN3_OMNI), *TWO_H200, "--json"]) == 0
    alias = capsys.readouterr().out
    assert main(["plan", str(QWEN3_OMNI), *TWO_H200, "--format", "json"]) == 0
    assert capsys.readouterr().out == alias
    assert json.loads(alias)["pipeline"] == "qwen3-omni"
    target = tmp_path / "plan.txt"
    assert main(["plan", str(QWEN3_OMNI), *TWO_H200, "--output", str(target)]) == 0
    assert "processes" in target.read_text() and "thinker" in target.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "bogus"], "'bogus' is not one of 'text', 'json', 'svg', 'html'"),
        (["--json", "--format", "svg"], "--json and --format svg ask for two formats"),
        (["--format", "svg", "-o", "/nonexistent-dir/plan.svg"], "cannot write"),
    ],
)
def test_bad_format_or_output_exits_2_saying_why(args, message, capsys):
    assert main(["plan", str(QWEN3_OMNI), *TWO_H200, *args]) == 2
    assert message in capsys.readouterr().err
