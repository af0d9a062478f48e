"""Weight sharing on a GPU: followers open CUDA IPC handles of the leader's tensors.

Needs a CUDA device (marked ``cuda``; skipped here, run on a GPU machine with
``pytest -m cuda tests/runtime/test_weight_share_cuda.py``). Two replicas of
the ``t-share`` stage on GPU 0: both compute what the weights filled in this
process compute, the follower's own allocator holds none of the weights (they
are the leader's memory), and no file of torch's is left in /dev/shm.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import omni_test_sharing as ts

from omni_core.testing import plan_on_cpu

WIDTH = 1024  # 4 MiB of float32 weights: far above what a follower allocates itself
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.anyio,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_followers_open_the_leaders_cuda_memory(plugins, short_tmp):
    flags = [
        "--gpus", "1", "--gpu-memory", "80GiB", "--mps", "off",
        "--weights.gpu", "0", "--weights.gpu_memory_fraction", "0.05",
        "--processes.p.num_replicas", "2", "--processes.p.replica_devices", "[0, 0]",
        "--weight_share", "on", "--runtime.binding", "round-robin",
        "--weights.factory.width", str(WIDTH),
    ]  # fmt: skip
    with plugins.registered(ts, ts.HERE):
        planned = plan_on_cpu(plugins, short_tmp, pipeline="t-share", flags=flags, policy=None)
        assert [(g.gpu, g.leader) for g in planned.plan.weight_share.groups] == [(0, "p@r0")]
        async with planned.runtime() as runtime:
            answers = [(await runtime.run({"x": 0.5}))["weights"] for _ in range(2)]
            pids = {c.proc.pid for c in runtime.children.values()}
    by_role = {a["role"]: a for a in answers}
    assert set(by_role) == {"leader", "follower"}
    weights = WIDTH * WIDTH * 4
    assert by_role["leader"]["allocated"] >= weights
    assert by_role["follower"]["allocated"] < weights  # the leader's memory, through IPC
    expected = ts.create_weights(width=WIDTH).model(torch.full((1, WIDTH), 0.5))
    for answer in answers:
        assert answer["device"] == "cuda:0"
        assert torch.allclose(torch.tensor(answer["y"]), expected.flatten(), atol=1e-3)
    assert by_role["leader"]["y"] == by_role["follower"]["y"]
    left = [n for n in os.listdir("/dev/shm") if any(f"torch_{p}_" in n for p in pids)]
    assert left == []
