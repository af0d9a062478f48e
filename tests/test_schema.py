"""One test per validation rule of the pipeline schema (issue 2, "Schema").

Every refusal must name the stage (or process) and the field, because the
person reading it has to find the line to change in a deploy file.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from omni_core import EngineStageConfig, PipelineConfig, ProcessConfig, StageConfig
from omni_core.schema import PLACEMENT_OWNED_FACTORY_KEYS, validation_message


def stage(name: str = "vocoder", **fields: Any) -> dict[str, Any]:
    """A valid terminal CPU stage as a dict, with ``fields`` overriding."""
    return {
        "name": name,
        "factory_path": "pkg.stages:create",
        "terminal": True,
        "process": "pipeline",
        **fields,
    }


def stage_error(model: type[StageConfig] = StageConfig, **fields: Any) -> str:
    """The message a stage built from ``stage(**fields)`` is refused with."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(stage(**fields))
    return validation_message(caught.value)


def pipeline_error(cls: type[PipelineConfig], **data: Any) -> str:
    """The message ``cls(**data)`` is refused with, stage indices shown as names."""
    names = [s["name"] for s in data.get("stages", []) if isinstance(s, dict)]
    with pytest.raises(ValidationError) as caught:
        cls(**data)
    return validation_message(caught.value, names)


class TwoStages(PipelineConfig):
    """front -> back: the smallest pipeline that has wiring to get wrong."""

    pipeline_name: ClassVar[str] = "test-two-stages"
    entry_stage: ClassVar[str] = "front"

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [
            StageConfig(**stage("front", terminal=False, next="back")),
            StageConfig(**stage("back")),
        ]


class MisspeltEntry(TwoStages):
    """An author typo in the entry stage."""

    pipeline_name: ClassVar[str] = "test-misspelt-entry"
    entry_stage: ClassVar[str] = "frnt"


class ColocatedByDefault(TwoStages):
    pipeline_name: ClassVar[str] = "test-colocated"
    default_placement_policy: ClassVar[str] = "colocate"


def test_the_helpers_build_valid_configs() -> None:
    """Guards the tests below: each refusal comes from the one field they change."""
    assert StageConfig.model_validate(stage()).name == "vocoder"
    assert TwoStages().stage_names == ["front", "back"]


def test_stage_names_must_be_unique() -> None:
    message = pipeline_error(
        TwoStages,
        stages=[stage("front", terminal=False, next="back"), stage("back"), stage("back")],
    )
    assert "stage 'back'" in message
    assert "'name'" in message
    assert "unique" in message


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"terminal": False}, "'next'"),  # neither
        ({"terminal": True, "next": "thinker"}, "'terminal'"),  # both
    ],
    ids=["neither", "both"],
)
def test_a_stage_has_exactly_one_of_next_or_terminal(fields: dict[str, Any], field: str) -> None:
    message = stage_error(**fields)
    assert "stage 'vocoder'" in message
    assert field in message


def test_wait_for_needs_a_merge_function() -> None:
    message = stage_error(name="thinker", wait_for=["preprocessing", "audio_encoder"])
    assert "stage 'thinker'" in message
    assert "'merge_fn'" in message
    assert "wait_for" in message


@pytest.mark.parametrize(
    ("field", "front"),
    [
        ("next", stage("front", terminal=False, next="bakc")),
        (
            "wait_for",
            stage("front", terminal=False, next="back", wait_for=["bakc"], merge_fn="m:f"),
        ),
        ("stream_to", stage("front", terminal=False, next="back", stream_to=["bakc"])),
    ],
)
def test_every_referenced_stage_exists(field: str, front: dict[str, Any]) -> None:
    message = pipeline_error(TwoStages, stages=[front, stage("back")])
    assert "stage 'front'" in message
    assert f"field '{field}'" in message
    assert "'bakc'" in message
    assert "did you mean: back" in message


def test_the_entry_stage_exists() -> None:
    message = pipeline_error(MisspeltEntry)
    assert "'entry_stage'" in message
    assert "'frnt'" in message
    assert "did you mean: front" in message


def test_a_stage_without_a_process_gets_one_of_its_own(plugins) -> None:
    from omni_core.plan import plan_deployment

    class Lone(PipelineConfig):
        pipeline_name: ClassVar[str] = "lone"
        entry_stage: ClassVar[str] = "a"

        @classmethod
        def default_stages(cls) -> list[StageConfig]:
            return [
                StageConfig(name="a", factory_path="m:f", next="b"),
                StageConfig(name="b", factory_path="m:f", terminal=True, process="shared"),
            ]

    plan = plan_deployment(Lone(), plugins=plugins)
    assert {p.name: list(p.stages) for p in plan.processes} == {"a": ["a"], "shared": ["b"]}
    # A TP stage gets one process per rank, so it leaves `process` out too.
    tp = StageConfig.model_validate(stage("thinker", process=None, tp_size=2, gpu=[0, 1]))
    assert tp.process is None


def test_the_engine_group_is_only_allowed_on_engine_stages() -> None:
    message = stage_error(engine={"mem_fraction_static": 0.5})
    assert "stage 'vocoder'" in message
    assert "'engine'" in message
    engine_stage = EngineStageConfig.model_validate(
        stage("thinker", gpu=0, engine={"mem_fraction_static": 0.5})
    )
    assert engine_stage.engine.mem_fraction_static == 0.5


def test_a_scalar_gpu_with_tp_size_above_one_is_refused() -> None:
    message = stage_error(name="thinker", gpu=0, tp_size=2)
    assert "stage 'thinker'" in message
    assert "'gpu'" in message
    assert "tp_size = 2" in message


def test_a_gpu_list_whose_length_differs_from_tp_size_is_refused() -> None:
    message = stage_error(name="thinker", gpu=[0, 1, 2], tp_size=2)
    assert "stage 'thinker'" in message
    assert "'gpu'" in message
    assert "lists 3 GPU ids but tp_size = 2" in message


def test_duplicate_gpu_ids_are_refused() -> None:
    message = stage_error(name="thinker", gpu=[1, 1], tp_size=2)
    assert "stage 'thinker'" in message
    assert "'gpu'" in message
    assert "repeats" in message


def test_negative_gpu_ids_are_refused() -> None:
    message = stage_error(gpu=-1)
    assert "stage 'vocoder'" in message
    assert "'gpu'" in message
    assert "negative" in message


@pytest.mark.parametrize("fraction", [0, -0.1, 1.01])
def test_gpu_memory_fraction_is_in_the_half_open_unit_interval(fraction: float) -> None:
    message = stage_error(gpu=0, gpu_memory_fraction=fraction)
    assert "stage 'vocoder'" in message
    assert "'gpu_memory_fraction'" in message
    assert "(0, 1]" in message
    # The closed end is allowed: a stage may own the whole card.
    assert StageConfig.model_validate(stage(gpu=0, gpu_memory_fraction=1.0)).gpu_memory_fraction


def test_total_reserve_bytes_and_gpu_memory_fraction_are_exclusive() -> None:
    message = stage_error(gpu=0, gpu_memory_fraction=0.1, total_reserve_bytes="2GiB")
    assert "stage 'vocoder'" in message
    assert "'gpu_memory_fraction'" in message
    assert "'total_reserve_bytes'" in message
    assert "exclusive" in message


def test_total_reserve_bytes_reads_sizes_with_units() -> None:
    assert (
        StageConfig.model_validate(stage(gpu=0, total_reserve_bytes="2GiB")).total_reserve_bytes
        == 2 * 1024**3
    )
    assert StageConfig.model_validate(
        stage(gpu=0, total_reserve_bytes=4096)
    ).total_reserve_bytes == (4096)
    message = stage_error(gpu=0, total_reserve_bytes="two gigs")
    assert "stage 'vocoder'" in message
    assert "'total_reserve_bytes'" in message
    assert "2GiB" in message  # the refusal shows a spelling that works


@pytest.mark.parametrize("key", sorted(PLACEMENT_OWNED_FACTORY_KEYS))
def test_placement_owned_keys_are_refused_under_factory(key: str) -> None:
    message = stage_error(gpu=0, factory={key: 0, "dtype": "float32"})
    assert "stage 'vocoder'" in message
    assert f"factory.{key}" in message
    assert "placement" in message
    # The same keys reach the factory as standard kwargs; ordinary keys pass through.
    ok = StageConfig.model_validate(stage(gpu=0, factory={"dtype": "float32"}))
    assert ok.factory.free_keys() == {"dtype": "float32"}


def test_process_config_num_replicas_and_replica_devices() -> None:
    message = pipeline_error(TwoStages, processes={"pipeline": {"num_replicas": 0}})
    assert "processes.pipeline" in message
    assert "num_replicas" in message
    assert ProcessConfig.model_validate({"replica_devices": "1,2"}).replica_devices == [1, 2]
    assert ProcessConfig.model_validate({"replica_devices": [3]}).replica_devices == [3]
    with pytest.raises(ValidationError, match="replica_devices"):
        ProcessConfig.model_validate({"replica_devices": "1,two"})


def test_processes_name_a_process_some_stage_runs_in() -> None:
    config = TwoStages(processes={"pipline": {"num_replicas": 2}})
    [(paths, message, fix)] = config.process_problems()
    assert paths == (("processes", "pipline", "num_replicas"),)  # who wrote it is named
    assert "processes.pipline" in message
    assert "did you mean: pipeline" in fix


def test_setting_a_placement_limit_keeps_the_pipelines_policy() -> None:
    """Regression: a `[placement]` table without `policy` used to reset it to "declared"."""
    config = ColocatedByDefault(placement={"memory_limit": 0.9})
    assert config.placement.policy == "colocate"
    assert config.placement.memory_limit == 0.9
    assert ColocatedByDefault().placement.policy == "colocate"
