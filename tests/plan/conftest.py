"""Fixtures of the planning tests: inventories and config builders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from omni_core import EngineStageConfig, PipelineConfig, StageConfig
from omni_core.plan import GpuInventory

GiB = 1024**3


@pytest.fixture
def h100x2() -> GpuInventory:
    return GpuInventory.uniform(2, 80 * GiB, mps_available=True)


@pytest.fixture
def h100() -> GpuInventory:
    return GpuInventory.uniform(1, 80 * GiB, mps_available=True)


def build(cls: type[PipelineConfig], updates: dict[str, dict[str, Any]] | None = None, **kw):
    """``cls`` with some stages' settings changed (as a deploy file would)."""
    updates = updates or {}
    unknown = set(updates) - {s.name for s in cls.default_stages()}
    assert not unknown, unknown
    stages = [s.model_copy(update=updates.get(s.name, {})) for s in cls.default_stages()]
    return cls(stages=stages, **kw)


@pytest.fixture
def configure() -> Callable[..., PipelineConfig]:
    return build


class TpPipeline(PipelineConfig):
    """front (CPU) -> big (engine, TP 2 on GPUs 0, 1) -> back (GPU 0)."""

    pipeline_name: ClassVar[str] = "test-tp"
    entry_stage: ClassVar[str] = "front"
    tensor_parallel_stages: ClassVar[tuple[str, ...]] = ("big",)

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [
            StageConfig(name="front", factory_path="x:y", next="big", process="front"),
            EngineStageConfig(
                name="big",
                factory_path="x:y",
                next="back",
                tp_size=2,
                gpu=[0, 1],
                gpu_memory_fraction=0.5,
            ),
            StageConfig(
                name="back",
                factory_path="x:y",
                terminal=True,
                process="back",
                gpu=0,
                gpu_memory_fraction=0.1,
            ),
        ]


@pytest.fixture
def tp_pipeline() -> type[PipelineConfig]:
    return TpPipeline
