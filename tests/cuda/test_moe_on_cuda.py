"""Qwen3-Omni's mixtures of experts on CUDA: the stacked path reads nothing on the host and
is captured as a CUDA graph, where torch's grouped kernel is fused (bf16, Hopper/Blackwell).

Marked ``cuda`` (run by ``benchmarks/gpu_check.py``). The first GPU check could not
capture the thinker or the talker at all: their experts looped on the host, one
synchronisation per layer (48 a thinker step). These check the three claims the
thinker's and talker's ``graph_safe`` rest on: no wait under
``set_sync_debug_mode("error")``, a captured graph that replays like eager, and the
same numbers as the per-expert loop.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")


def _moe():
    from omni_qwen3_omni.thinker.expert_stack import graph_capturable
    from omni_qwen3_omni.thinker.moe import SparseMoE

    device = torch.device(DEVICE)
    if not graph_capturable(device, torch.bfloat16):
        pytest.skip("torch's fused grouped kernel needs compute capability 9.x or 10.x")
    torch.manual_seed(0)
    moe = SparseMoE(2048, 768, 128, 8).to(device, torch.bfloat16).eval()
    with torch.no_grad():
        for expert in moe.experts:
            for layer in (expert.gate_proj, expert.up_proj, expert.down_proj):
                layer.weight.normal_(0, layer.in_features**-0.5)
    return moe, device


def test_the_stacked_mixture_never_waits_and_matches_the_loop() -> None:
    moe, device = _moe()
    x = torch.randn(8, 2048, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        assert moe.uses_stack()  # stacks outside the check below (a copy, on the device)
        moe(x)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = moe(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        looped = moe._looped(x)
    torch.testing.assert_close(out.float(), looped.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_the_stacked_mixture_is_captured_and_replays_like_eager(tokens: int) -> None:
    moe, device = _moe()
    static_x = torch.randn(tokens, 2048, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = moe(static_x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            moe(static_x)  # warm on a side stream, as torch's capture recipe asks
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = moe(static_x)
        graph.replay()
        torch.testing.assert_close(static_out, eager, rtol=0, atol=0)
        fresh = torch.randn(tokens, 2048, device=device, dtype=torch.bfloat16)
        static_x.copy_(fresh)  # other tokens route to other experts: offsets on the device
        graph.replay()
        torch.testing.assert_close(static_out, moe(fresh), rtol=0, atol=0)


def test_the_thinker_step_is_planned_for_cuda_graphs_there() -> None:
    from omni_qwen3_omni.thinker.moe import mixtures_capturable

    moe, device = _moe()
    assert mixtures_capturable(moe, device, torch.bfloat16)
