"""``omni plan DEPLOY [flags] [--json]`` on the shipped examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_core.cli import main

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.toml"))


@pytest.fixture(autouse=True)
def _fresh_plugins(plugins):
    """The CLI uses the process-wide manager; the fixture resets it around each test."""
    yield


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_plans(example, capsys):
    assert main(["plan", str(example), "--no-detect"]) == 0
    out = capsys.readouterr().out
    assert "processes" in out
    assert "runtime dir:" in out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_plans_as_json(example, capsys):
    assert main(["plan", str(example), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("processes", "gpus", "weight_share", "mps", "endpoints", "policy"):
        assert key in data


def test_flags_plan_for_other_hardware(capsys):
    example = next(p for p in EXAMPLES if p.stem == "qwen3_omni")
    code = main(
        [
            "plan",
            str(example),
            "--json",
            "--gpus",
            "2",
            "--gpu-memory",
            "80GiB",
            "--placement.policy",
            "auto",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["policy"] == "auto"
    assert data["inventory"]["count"] == 2
    assert data["processes"][3]["name"] == "thinker"


def test_two_replicas_example(capsys):
    example = next(p for p in EXAMPLES if p.stem == "qwen3_tts_two_replicas")
    assert main(["plan", str(example), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in data["processes"]] == ["pipeline@r0", "pipeline@r1"]
    assert data["weight_share"]["groups"][0]["leader"] == "pipeline@r0"


def test_infeasible_plan_exits_2_with_reasons(capsys):
    example = next(p for p in EXAMPLES if p.stem == "qwen3_omni")
    assert main(["plan", str(example), "--gpus", "1"]) == 2
    err = capsys.readouterr().err
    assert "GPU 1 (asked for by stage talker_ar) is beyond the inventory" in err
    assert "hint:" in err


def test_colocated_without_shares_via_flags(capsys):
    assert main(["plan", "--pipeline", "qwen3-omni-colocated"]) == 2
    err = capsys.readouterr().err
    for stage in ("audio_encoder", "image_encoder", "talker_ar", "thinker"):
        assert f"stage {stage!r}" in err
