"""A one-stage pipeline whose engine stage loads a small torch model through the
weight-sharing seam (a plugin module for the weight-sharing runtime tests).

Registered in-process by the tests and, by module name, in the child
processes. Knobs (``factory.*``) let a test break what it wants to see fail:
``seam = false`` loads without the seam, ``follower_width`` builds another
shape in followers, ``fail_after_load`` fails once the weights are published.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from omni_core import EngineStageConfig, PipelineConfig, hookimpl
from omni_core.engine.mapped import is_mapped
from omni_core.runtime.weight_share import current, share_weights

HERE = "omni_test_sharing"


class Weights:
    """Multiplies the request's vector by a seeded matrix; says where the matrix lives."""

    def __init__(self, model: nn.Module):
        self.model = model
        # What this process's own allocator holds once the weights are in (CUDA IPC memory
        # opened from the leader is not counted), taken before any compute: a first matmul
        # allocates cuBLAS's workspace (32 MiB on Hopper) through the same allocator.
        device = model.weight.device
        self.allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0

    async def run(self, request: Any) -> dict[str, Any]:
        data = request.data or {}
        device = self.model.weight.device
        x = torch.full((1, self.model.in_features), float(data.get("x", 1.0)), device=device)
        with torch.no_grad():
            y = self.model(x)
        with open("/proc/self/maps") as maps:
            memfd = any("memfd:omni-weights" in line for line in maps)
        return {
            "y": y.flatten().cpu().tolist(),
            "pid": os.getpid(),
            "mapped": is_mapped(self.model.weight),
            "memfd": memfd,
            "role": current().kind,
            "device": str(device),
            "allocated": self.allocated,
        }


def create_weights(
    width: int = 64,
    seam: bool = True,
    follower_width: int | None = None,
    fail_after_load: bool = False,
    gpu_id: int | None = None,
) -> Weights:
    device = "cpu" if gpu_id is None else f"cuda:{gpu_id}"
    if follower_width is not None and current().kind == "follower":
        width = follower_width
    with torch.device("meta"):
        model = nn.Linear(width, width)
    model = model.to_empty(device=device)

    def fill(module: nn.Module) -> None:
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for tensor in (module.weight, module.bias):
                tensor.copy_(torch.randn(tensor.shape, generator=generator).to(device))

    if seam:
        share_weights("t-share:linear", model, fill)
    else:
        fill(model)
    if fail_after_load:
        raise RuntimeError("asked to fail after loading")
    return Weights(model)


SharePipeline = type(
    "SharePipeline",
    (PipelineConfig,),
    {
        "__module__": __name__,
        "pipeline_name": "t-share",
        "entry_stage": "weights",
        "description": "test pipeline t-share",
        "default_stages": classmethod(
            lambda cls: [
                EngineStageConfig(
                    name="weights",
                    factory_path=f"{HERE}:create_weights",
                    terminal=True,
                    process="p",
                )
            ]
        ),
        "__annotations__": {},
    },
)


@hookimpl
def omni_register_pipelines() -> list[type[PipelineConfig]]:
    return [SharePipeline]
