"""A GPU engine stage's ``engine.max_running_requests``, sized from memory when unwritten.

The fixed default (8) left a Qwen3-TTS engine on 0.6 of an H200 with 8 slots
of 32,768 positions and two thirds of its share free, while SGLang sizes its
running requests from its pool. The plan now decides the number (as many
full-length requests as the share holds, 8 to 256), prints it, and hands the
same number to admission, the CUDA-graph buckets and the stage's factory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from omni_core.config import load_deployment
from omni_core.engine.budget import MEMORY_SIZED_MAX_SLOTS, memory_sized_slots
from omni_core.factory import StageContext
from omni_core.plan import inventory_from_cluster, plan_deployment
from omni_core.plan.admission import admission_limit
from omni_core.plan.estimates import collect_estimates
from omni_core.plan.render import render_plan
from omni_core.schema import EngineArgs, EngineStageConfig, PipelineConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def planned(plugins: Any, example: str, *flags: str) -> Any:
    resolution = load_deployment(str(EXAMPLES / example), list(flags), plugins=plugins)
    inventory = inventory_from_cluster(resolution.config.cluster)
    return resolution.config, plan_deployment(resolution.config, inventory, plugins)


@pytest.mark.parametrize(
    ("positions", "max_positions", "expected"),
    [
        (776_255, 32_768, 23),  # Qwen3-TTS 0.6B on 0.6 of an H200
        (100_000, 32_768, 8),  # fewer full-length requests than the default: the default
        (10**9, 4_096, MEMORY_SIZED_MAX_SLOTS),  # a tiny model on a big share: capped
        (10**9, None, 8),  # the model's length unknown: nothing to size by
    ],
)
def test_slots_are_full_length_requests_between_the_default_and_the_cap(
    positions: int, max_positions: int | None, expected: int
) -> None:
    assert memory_sized_slots(positions, max_positions, 8) == expected


def test_the_plan_sizes_an_unwritten_limit_and_every_reader_agrees(plugins, capsys) -> None:
    config, plan = planned(plugins, "qwen3_tts.toml", "--gpus", "1", "--gpu-memory", "141GiB")
    estimate = collect_estimates(config, plugins)["tts_engine"]
    room = int(141 * 1024**3 * 0.6) - estimate.weights_bytes
    expected = (room // estimate.kv_bytes_per_token) // estimate.max_positions
    assert expected > 8  # the case this is about: the default would leave the share idle
    assert plan.running_requests == {"tts_engine": expected}
    assert plan.to_dict()["running_requests"] == {"tts_engine": expected}
    assert plan.admission_limit == expected
    assert admission_limit(config, {"pipeline": 1}, plan.running_requests) == expected
    assert admission_limit(config, {"pipeline": 1}) == 8  # without the plan: the default
    words = plan.caches["tts_engine"]
    assert f"{expected} slots of 32,768" in words
    assert f"engine.max_running_requests {expected}, sized from memory" in words
    assert plan.decodes["tts_engine"].startswith("CUDA graphs for batch sizes 1, 2, 4, 8, 16, ")
    assert f"engine.cuda_graph_max_bs {expected};" in plan.decodes["tts_engine"]
    render_plan(plan)
    out = capsys.readouterr().out
    assert f"admission: at most {expected} requests in flight" in out


def test_a_written_limit_is_kept(plugins) -> None:
    flags = ["--gpus", "1", "--gpu-memory", "141GiB", "--tts_engine.engine.max_running_requests"]
    _, plan = planned(plugins, "qwen3_tts.toml", *flags, "12")
    assert plan.running_requests == {}
    assert plan.admission_limit == 12
    assert "12 slots of 32,768" in plan.caches["tts_engine"]
    assert "sized from memory" not in plan.caches["tts_engine"]


def test_a_cpu_plan_sizes_nothing(plugins) -> None:
    _, plan = planned(plugins, "qwen3_tts.toml", "--placement.policy", "cpu")
    assert plan.running_requests == {}
    assert plan.admission_limit == 8


def test_the_stage_factory_gets_the_plans_number_unless_the_file_wrote_one(
    plugins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sized_factories.py").write_text(
        "def make(model_path, engine_settings):\n    return engine_settings\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    class OneStage(PipelineConfig):
        pipeline_name: ClassVar[str] = "test-sized-stage"
        default_model_path: ClassVar[str] = "org/model"

    def build(engine: EngineArgs) -> Any:
        stage = EngineStageConfig(
            name="engine",
            factory_path="sized_factories:make",
            terminal=True,
            process="pipeline",
            engine=engine,
        )
        context = StageContext(instance="engine", process="pipeline", running_requests=23)
        return plugins.build_stage(stage, OneStage(stages=[stage]), context)

    assert build(EngineArgs(max_total_tokens=4096)).max_running_requests == 23
    assert build(EngineArgs(max_running_requests=5)).max_running_requests == 5
