"""Sibling projections fused into one product: same outputs, same parameters, safe fallbacks."""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from omni_core.engine import mapped  # noqa: E402
from omni_core.engine.cpu_linear import RowLinear, pack_linear_weights  # noqa: E402
from omni_core.engine.fused_linear import (  # noqa: E402
    fuse_projections,
    fuse_sibling_projections,
    project,
)

ROUTED = (RowLinear,)  # what pack_linear_weights fuses


class Block(nn.Module):
    """Attention's and the MLP's projections in miniature, opted in as the real layers are."""

    sibling_projections = (("q", "k", "v"), ("gate", "up"))

    def __init__(self, width: int = 256, bias: bool = False):
        super().__init__()
        self.q = nn.Linear(width, 512, bias=bias)
        self.k = nn.Linear(width, 256, bias=bias)
        self.v = nn.Linear(width, 256, bias=bias)
        self.gate = nn.Linear(width, 768, bias=False)
        self.up = nn.Linear(width, 768, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = project(x, self.q, self.k, self.v)
        gate, up = project(x, self.gate, self.up)
        return torch.cat((q, k * v), -1).sum(-1, keepdim=True) + F.silu(gate) * up


def _routed(seed: int = 0, bias: bool = False, dtype: Any = torch.bfloat16) -> Block:
    """A block whose bf16 layers are RowLinear, unfused (the baseline fusing must equal)."""
    torch.manual_seed(seed)
    block = Block(bias=bias).to(dtype)
    for layer in block.children():
        if layer.weight.dtype == torch.bfloat16:
            layer.__class__ = RowLinear
    return block


def _fusions(module: nn.Module) -> int:
    return sum("_omni_fusion" in m.__dict__ for m in module.modules())


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_give_the_separate_products_bit_for_bit(bias):
    separate, fused = _routed(bias=bias), _routed(bias=bias)
    params = dict(fused.named_parameters())
    assert fuse_sibling_projections(fused, ROUTED) == 2 and _fusions(fused) == 2
    assert dict(fused.named_parameters()) == params  # the same parameter objects
    storage = fused.q.weight.untyped_storage().data_ptr()
    assert fused.v.weight.untyped_storage().data_ptr() == storage  # one tensor behind both
    with torch.no_grad():
        for shape in [(1, 256), (1, 1, 256), (4, 256), (2, 3, 256), (17, 256)]:
            x = torch.randn(*shape).to(torch.bfloat16)
            torch.testing.assert_close(fused(x), separate(x), atol=0, rtol=0)
    for (name, a), (_, b) in zip(
        fused.state_dict().items(), separate.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_fusing_twice_fuses_nothing_new():
    block = _routed()
    assert fuse_sibling_projections(block, ROUTED) == 2
    assert fuse_sibling_projections(block, ROUTED) == 0
    assert pack_linear_weights(block) == 0


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's RSS")
def test_fusing_leaves_no_second_copy_resident():
    """The originals are freed and their pages returned: RSS does not grow by the fused bytes."""

    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    blocks = [_routed(seed=i) for i in range(24)]  # 24 x 2.5 MB of weights
    fused_bytes = sum(p.numel() * 2 for b in blocks for p in b.parameters())
    gc.collect()
    before = resident()
    assert sum(fuse_sibling_projections(b, ROUTED) for b in blocks) == 48
    gc.collect()
    assert resident() - before < 0.1 * fused_bytes


def test_pack_linear_weights_fuses_the_groups_a_module_names():
    torch.manual_seed(0)
    block = Block().to(torch.bfloat16)
    assert pack_linear_weights(block) == 5  # routed layers, counted once each
    assert _fusions(block) == 2


def test_loading_weights_after_fusing_reaches_the_fused_product():
    fused, other = _routed(seed=0), _routed(seed=1)
    fuse_sibling_projections(fused, ROUTED)
    fused.load_state_dict(other.state_dict())  # copies in place, into the views
    x = torch.randn(3, 256).to(torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), other(x), atol=0, rtol=0)


def test_moved_weights_fall_back_to_separate_products_and_free_the_fused_copy():
    block = _routed()
    fuse_sibling_projections(block, ROUTED)
    block.to(torch.float32)  # new tensors for every parameter: the fused ones are stale
    x = torch.randn(2, 256)
    with torch.no_grad():
        want = Block.forward(block, x)  # computes through project, which must notice
        assert _fusions(block) == 0
        separate = torch.cat((block.q(x), block.k(x) * block.v(x)), -1).sum(
            -1, keepdim=True
        ) + F.silu(block.gate(x)) * block.up(x)
    torch.testing.assert_close(want, separate, atol=0, rtol=0)


def test_a_replaced_member_is_computed_on_its_own():
    block = _routed()
    fuse_sibling_projections(block, ROUTED)
    block.k = nn.Linear(256, 256).to(torch.bfloat16)  # a shard, a quantized layer...
    x = torch.randn(1, 256).to(torch.bfloat16)
    with torch.no_grad():
        q, k, v = project(x, block.q, block.k, block.v)
        for got, layer in ((q, block.q), (k, block.k), (v, block.v)):
            torch.testing.assert_close(got, layer(x), atol=0, rtol=0)
    assert "_omni_fusion" not in block.q.__dict__


def test_what_is_not_fused():
    assert fuse_projections([(nn.Linear(256, 512), nn.Linear(256, 256))], ROUTED) == 0  # a kind
    float32 = _routed(dtype=torch.float32)  # RowLinear is bf16's route: float32 stays plain
    assert fuse_sibling_projections(float32, ROUTED) == 0

    shared = _routed()
    shared.q.weight.data.share_memory_()
    assert fuse_projections([(shared.q, shared.k, shared.v)], ROUTED) == 0

    block = _routed()
    weight = block.k.weight
    mapped.add_range(weight.untyped_storage().data_ptr(), weight.untyped_storage().nbytes())
    try:
        # a weight mapped from shared memory (weight sharing)
        assert fuse_projections([(block.q, block.k, block.v)], ROUTED) == 0
    finally:
        mapped.remove_range(weight.untyped_storage().data_ptr())

    mixed = _routed()
    mixed.k.bias = nn.Parameter(torch.zeros(256, dtype=torch.bfloat16))
    assert fuse_projections([(mixed.q, mixed.k)], ROUTED) == 0  # one with a bias, one without
    assert fuse_projections([(mixed.q, mixed.q)], ROUTED) == 0  # a layer twice
    assert fuse_projections([(mixed.q,)], ROUTED) == 0  # nothing to fuse with


def test_a_compiled_step_makes_one_product_per_fused_group():
    block = _routed()
    fuse_sibling_projections(block, ROUTED)
    graphs: list[Any] = []

    def capture(graph: Any, inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    x = torch.randn(1, 256).to(torch.bfloat16)
    with torch.no_grad():
        want = block(x)
        torch._dynamo.reset()
        got = torch.compile(block, backend=capture, dynamic=False)(x)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    targets = [str(n.target) for n in graphs[-1].graph.nodes if n.op == "call_function"]
    assert targets.count("omni.row_product") == 2, targets
