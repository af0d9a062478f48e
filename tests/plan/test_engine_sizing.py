"""An engine that sizes itself by engine.mem_fraction_static is shown as such, and counted.

``examples/qwen3_omni.toml`` gives the thinker and the talker their engines'
``mem_fraction_static`` (0.8, 0.7) and no placement share: the plan used to print
them as "memory share undeclared" and commit nothing for them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_core.config import load_deployment
from omni_core.errors import ConfigError
from omni_core.plan import inventory_from_cluster, plan_deployment
from omni_core.plan.picture import plan_svg
from omni_core.plan.render import render_plan

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3_omni.toml"


def planned(plugins, *flags: str):
    resolution = load_deployment(
        str(EXAMPLE), ["--gpus", "2", "--gpu-memory", "80GiB", *flags], plugins=plugins
    )
    inventory = inventory_from_cluster(resolution.config.cluster)
    return plan_deployment(resolution.config, inventory, plugins)


def test_engine_sized_stages_are_shown_and_committed_in_json(plugins):
    data = planned(plugins).to_dict()
    stages = {s["instance"]: s for s in data["stages"]}
    assert stages["thinker"]["engine_memory_fraction"] == 0.8
    assert stages["talker_ar"]["engine_memory_fraction"] == 0.7
    assert stages["code2wav"]["engine_memory_fraction"] is None  # declares its share
    gpu0, gpu1 = data["gpus"]["0"], data["gpus"]["1"]
    assert gpu0["engine_memory_fractions"] == {"thinker": 0.8}
    assert gpu0["committed_fraction"] == pytest.approx(0.82)
    assert "thinker" not in gpu0["undeclared_stages"]
    assert gpu0["undeclared_stages"] == ["audio_encoder", "image_encoder"]
    assert gpu1["undeclared_stages"] == [] and gpu1["committed_fraction"] == 0.7


def test_the_text_and_the_picture_say_how_the_engines_size_themselves(plugins, capsys):
    plan = planned(plugins)
    render_plan(plan)
    text = capsys.readouterr()
    out = text.out + text.err
    assert "engine 0.80" in out and "engine 0.70" in out
    assert "0.02 + engines 0.80 (= 0.82)" in out
    svg = plan_svg(plan)
    assert "engine: mem_fraction_static 0.8" in svg
    assert "engine: mem_fraction_static 0.7" in svg


def test_engine_fractions_count_against_the_memory_limit(plugins):
    with pytest.raises(ConfigError) as caught:
        planned(plugins, "--thinker.engine.mem_fraction_static", "0.99")
    message = str(caught.value)
    assert "GPU 0: memory shares sum to 1.01" in message
    assert "thinker engine.mem_fraction_static 0.99" in message


def test_the_plan_says_how_many_cache_positions_each_share_leaves(plugins, capsys):
    from omni_core.plan.estimates import collect_estimates

    plan = planned(plugins)
    thinker = collect_estimates(plan_config(plugins), plugins)["thinker"]
    room = int(80 * 1024**3 * 0.8) - thinker.weights_bytes
    positions = room // thinker.kv_bytes_per_token
    assert thinker.kv_bytes_per_token > 0 and positions > 8
    words = plan.caches["thinker"]
    assert words.startswith("engine.mem_fraction_static 0.8 of GPU 0 (64GiB) less about ")
    assert f"about {positions:,} positions, 8 slots of {positions // 8:,}" in words
    assert plan.to_dict()["caches"]["thinker"] == words
    # the talker's share holds millions of positions; a slot takes no more than the model
    # does, and the plan runs as many such slots as fit (tests/plan/test_running_requests.py)
    talker = plan.caches["talker_ar"]
    slots = plan.running_requests["talker_ar"]
    assert slots > 8
    assert f"{slots} slots of 32,768 (capped at the model's max_position_embeddings" in talker
    render_plan(plan)
    assert f"cache thinker: {words}" in capsys.readouterr().out
    fixed = planned(plugins, "--thinker.engine.max_total_tokens", "4096")
    assert "thinker" not in fixed.caches  # a fixed number of positions: nothing to derive


def test_a_share_too_small_for_the_weights_is_refused_before_anything_starts(plugins):
    with pytest.raises(ConfigError) as caught:
        planned(plugins, "--thinker.engine.mem_fraction_static", "0.1")
    message = str(caught.value)
    assert (
        "stage 'thinker': engine.mem_fraction_static 0.1 of GPU 0 (8GiB) holds its weights"
        in message
    )
    assert "not one position for each of its 8 running requests" in message
    assert "engine.max_total_tokens" in message  # the fix names the way out


def plan_config(plugins):
    resolution = load_deployment(
        str(EXAMPLE), ["--gpus", "2", "--gpu-memory", "80GiB"], plugins=plugins
    )
    return resolution.config
