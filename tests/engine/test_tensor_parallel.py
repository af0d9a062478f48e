"""The tensor-parallel core: the step codec, rendezvous, sharded layers and breaks.

Groups are real: each rank is a Python process joined over gloo through a
file store, as the runtime starts them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from omni_core.engine.tp import TPStartError, init_group
from omni_core.engine.tp.channel import decode, encode
from omni_core.engine.tp.group import EXIT_BROKEN

# One rank: argv = rank, store path, output path, scenario.
RANK = textwrap.dedent(
    """
    import os, sys, torch
    from torch import nn
    from omni_core.engine.tp import (
        AllReduceOutput, Mirror, RowParallelLinear, StepChannel, init_group, split_columns,
    )
    rank, store, out, scenario = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    group = init_group(name="demo", rank=rank, size=2, store_path=store, backend="gloo",
                       device="cpu", timeout=60, ranks=["demo_tp0", "demo_tp1"])
    group.grace = 0.5
    torch.manual_seed(0)
    up, down = nn.Linear(8, 12, bias=True), nn.Linear(12, 8, bias=True)
    x = torch.randn(3, 8)
    if scenario == "layers":
        full = down(torch.relu(up(x)))
        col, row = split_columns(up, rank, 2), RowParallelLinear(down, group)
        with torch.inference_mode():
            sharded = row(torch.relu(col(x)))
            summed = AllReduceOutput(nn.Identity(), group)(torch.full((2,), rank + 1.0))
        channel = StepChannel(group)
        value = [x, (3, -4, 2.5, None, True), [torch.tensor([True, False])]]
        if rank == 0:
            channel.send(7, value)
            got = (7, value)
        else:
            got = channel.recv()
        torch.save({"full": full, "sharded": sharded, "summed": summed, "got": got}, out)
    elif scenario == "break":
        # Both ranks' connections are up once a barrier passes: a rank gone while the
        # group still forms is init_group's error (a TPStartError), not this scenario.
        torch.distributed.barrier()
        if rank == 1:
            os._exit(3)  # gone before the collective
        group.all_reduce(torch.ones(2))
    """
)


def _start(tmp_path, rank: int, scenario: str) -> subprocess.Popen:
    out = tmp_path / f"rank{rank}.pt"
    return subprocess.Popen(
        [sys.executable, "-c", RANK, str(rank), str(tmp_path / "store"), str(out), scenario],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_codec_round_trips_nested_values_of_tensors_and_scalars():
    value = [
        torch.arange(6, dtype=torch.int64).view(2, 3),
        (torch.ones(2, dtype=torch.bfloat16), None, [1.25, -7, False]),
        torch.tensor([[True], [False]]),
        [],
    ]
    header, tensors = encode(value)
    assert all(isinstance(w, int) for w in header)
    parts = iter(tensors)
    back = decode(header, lambda dtype, shape: next(parts))
    assert back[0].equal(value[0]) and back[2].equal(value[2])
    assert back[1][0].dtype == torch.bfloat16 and back[1][1] is None
    assert back[1][2] == [1.25, -7, False] and isinstance(back[1][2][2], bool)
    assert back[3] == [] and isinstance(back[1], tuple)


def test_codec_refuses_objects_and_malformed_headers():
    with pytest.raises(TypeError, match="cannot carry a dict"):
        encode([{"a": 1}])
    with pytest.raises(TypeError, match="complex"):
        encode(torch.zeros(1, dtype=torch.complex64))
    with pytest.raises(ValueError, match="ended early"):
        decode([5, 3, 1], lambda d, s: None)
    with pytest.raises(ValueError, match="unknown kind"):
        decode([42], lambda d, s: None)
    with pytest.raises(ValueError, match="left over"):
        decode([0, 0], lambda d, s: None)
    with pytest.raises(ValueError, match="negative shape"):
        decode([4, 0, 1, -1], lambda d, s: None)


def test_two_ranks_shard_layers_exchange_steps_and_match_the_full_layer(tmp_path):
    procs = [_start(tmp_path, rank, "layers") for rank in range(2)]
    for proc in procs:
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, output
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        torch.testing.assert_close(got["sharded"], got["full"], rtol=1e-5, atol=1e-6)
        assert got["summed"].tolist() == [3.0, 3.0]  # 1 + 2 on both ranks
        op, value = got["got"]
        assert op == 7 and value[1] == (3, -4, 2.5, None, True)
        assert value[2][0].tolist() == [True, False]
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=False)
    assert rank0["sharded"].equal(rank1["sharded"])  # every rank ends with the same sum
    assert rank1["got"][1][0].equal(rank0["got"][1][0])


def test_a_peer_dying_while_the_group_forms_is_a_start_error(tmp_path, monkeypatch):
    """A peer gone between the rendezvous and the connections: named, not a traceback."""
    import torch.distributed as dist

    def refused(*args, **kwargs):
        raise RuntimeError("Gloo connectFullMesh failed with [pair.cc:553] Connection closed")

    monkeypatch.setattr(dist, "init_process_group", refused)
    with pytest.raises(TPStartError) as caught:
        init_group(
            name="thinker",
            rank=0,
            size=1,
            store_path=str(tmp_path / "store"),
            backend="gloo",
            device="cpu",
            timeout=5.0,
            ranks=["thinker_tp0"],
        )
    message = caught.value.render()
    assert "rank 0 (thinker_tp0) could not connect to the other ranks: Gloo" in message
    assert "ended while the group formed" in message


def test_a_rank_that_never_arrives_is_named(tmp_path):
    with pytest.raises(TPStartError) as caught:
        init_group(
            name="thinker",
            rank=0,
            size=2,
            store_path=str(tmp_path / "store"),
            backend="gloo",
            device="cpu",
            timeout=1.0,
            ranks=["thinker_tp0", "thinker_tp1"],
        )
    message = caught.value.render()
    assert "rank 1 (thinker_tp1) never arrived" in message
    assert "rank 0 (thinker_tp0) waited 1 s" in message


def test_a_rank_left_alone_by_a_dead_peer_exits_after_its_grace(tmp_path):
    procs = [_start(tmp_path, rank, "break") for rank in range(2)]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert procs[1].returncode == 3
    assert procs[0].returncode == EXIT_BROKEN, outputs[0]
    assert "tensor-parallel group 'demo': an all-reduce on rank 0 (demo_tp0) failed" in outputs[0]
    assert "exits so that the group is restarted" in outputs[0]
    assert not os.path.exists(tmp_path / "rank0.pt")
