"""A one-stage pipeline whose stage splits a two-layer MLP over tp_size rank processes
(a plugin module for the runtime's tensor-parallel tests).

Registered in-process by the tests and, by module name, in the child
processes. Rank 0 answers a request with the split MLP's output (mirrored to
the other ranks, as the thinker's passes are) beside the unsplit MLP's;
``factory.fail_rank`` makes that rank's factory fail, after rank 0's factory
has started waiting for it (``Mirror.setup``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from omni_core import PipelineConfig, StageConfig, hookimpl
from omni_core.engine.interface import CacheLayout
from omni_core.engine.tp import (
    FollowerStage,
    Mirror,
    RowParallelLinear,
    current_group,
    split_columns,
)

HERE = "omni_test_tp"


def _mlp(width: int) -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(3)
    return nn.Linear(width, 4 * width), nn.Linear(4 * width, width)


class Leader:
    def __init__(self, mirror: Mirror, split: Any, full: Any):
        self.mirror, self.split, self.full = mirror, split, full

    async def run(self, request: Any) -> dict[str, Any]:
        x = torch.tensor(request.data["x"], dtype=torch.float32)[None]
        self.mirror.step([x])
        with torch.no_grad():
            return {
                "y": self.split(x)[0].tolist(),
                "full": self.full(x)[0].tolist(),
                "pid": os.getpid(),
            }

    async def aclose(self) -> None:
        self.mirror.close()


def create_split(width: int = 8, fail_rank: int = -1, tp_rank: int = 0, tp_size: int = 1) -> Any:
    group = current_group()
    assert group is not None and (group.rank, group.size) == (tp_rank, tp_size)
    up, down = _mlp(width)
    split = nn.Sequential(
        split_columns(up, group.rank, group.size), nn.ReLU(), RowParallelLinear(down, group)
    )
    if tp_rank == fail_rank:
        raise RuntimeError(f"rank {tp_rank} cannot load its shard")
    if group.leader:
        mirror = Mirror(group)
        mirror.setup(1, 1)  # waits for every follower
        return Leader(mirror, split, nn.Sequential(up, nn.ReLU(), down))
    layout = CacheLayout(1, 1, 1, torch.float32, torch.device("cpu"))
    return FollowerStage(group, layout, lambda cache, value: split(value[0]), stage="split")


class SplitPipeline(PipelineConfig):
    pipeline_name = "t-tp"
    entry_stage = "split"
    description = "test pipeline t-tp"
    tensor_parallel_stages = ("split",)

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [
            StageConfig(
                name="split",
                factory_path=f"{HERE}:create_split",
                terminal=True,
                tp_size=2,
                gpu=[0, 1],
            )
        ]


@hookimpl
def omni_register_pipelines() -> list[type[PipelineConfig]]:
    return [SplitPipeline]
