"""bf16 layers with their weight in oneDNN's blocked layout (the ``bf16_blocked`` route).

Which machines take the route is measured (``cpu_kernel_choice``); here the
route is switched on by hand, so the tests do not depend on this machine.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from omni_core.engine import cpu_linear  # noqa: E402
from omni_core.engine.cpu_blocked_weight import blocked_product  # noqa: E402
from omni_core.engine.cpu_kernel_choice import KernelChoice  # noqa: E402
from omni_core.engine.cpu_linear import (  # noqa: E402
    BlockedLinear,
    BlockedRows,
    RowLinear,
    blocking_available,
    pack_linear_weights,
)
from omni_core.engine.fused_linear import project  # noqa: E402

pytestmark = pytest.mark.skipif(
    not blocking_available(), reason="this torch build or CPU has no oneDNN bf16 inner product"
)

#: bf16 products accumulate in float32 on both sides; the results may differ by a bf16
#: rounding where the kernels sum in another order (equal on the machine measured).
CLOSE = dict(atol=2e-2, rtol=1e-2)


@pytest.fixture
def blocked_routes(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_routes", cpu_linear.routes())
    chosen = KernelChoice(0, False, 0, bf16_blocked=True, source="measured")
    # pack_linear_weights takes this machine's routes: make them the blocked ones
    monkeypatch.setattr(cpu_linear, "kernel_choice", lambda onednn=True: chosen)
    return chosen


class Block(nn.Module):
    """Attention-like projections that read one input (fused on the dense routes)."""

    sibling_projections = (("q", "k"),)

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(256, 512, bias=True)
        self.k = nn.Linear(256, 256, bias=False)
        self.out = nn.Linear(768, 256, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([self.q(x), self.k(x)], dim=-1))


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(Block(), nn.SiLU(), nn.Linear(256, 8)).to(torch.bfloat16)


def test_blocked_layers_compute_what_the_dense_ones_did(blocked_routes):
    plain, blocked = _net(), _net()
    pack_linear_weights(blocked)
    kinds = [type(m).__name__ for m in (blocked[0].q, blocked[0].k, blocked[0].out, blocked[2])]
    assert kinds == ["BlockedLinear", "BlockedLinear", "BlockedLinear", "Linear"]  # 2048: small
    assert not hasattr(blocked[0].q, "_omni_fusion")  # not fused: a fused copy would stay too
    with torch.no_grad():
        for shape in [(1, 256), (8, 256), (2, 3, 256), (300, 256), (0, 256)]:
            x = torch.randn(*shape).to(torch.bfloat16)
            out = blocked(x)
            assert out.shape == plain(x).shape and out.dtype == torch.bfloat16
            torch.testing.assert_close(out, plain(x), **CLOSE)
    q = blocked[0].q
    assert torch.equal(q.weight, plain[0].q.weight)  # a dense copy for inspection
    assert torch.equal(q.bias, plain[0].q.bias)
    assert "q.weight" not in blocked.state_dict() and "0.q.bias" in blocked.state_dict()
    assert pack_linear_weights(blocked) == 0  # idempotent


def test_a_layer_whose_weight_is_held_elsewhere_stays_dense(blocked_routes):
    net = _net()
    tied = nn.Embedding(512, 256).to(torch.bfloat16)
    tied.weight = net[0].q.weight  # a head tied to an embedding
    holder = nn.ModuleDict({"net": net, "embedding": tied})
    net[0].k.weight.share_memory_()  # shared with other processes (weight sharing)
    pack_linear_weights(holder, skip=lambda name: name.endswith(".out"))
    assert type(net[0].q) is RowLinear and net[0].q.weight is tied.weight
    assert type(net[0].k) is RowLinear and net[0].k.weight.is_shared()
    assert type(net[0].out) is RowLinear  # named by skip


def test_a_layer_reached_through_two_parents_is_blocked_once(blocked_routes):
    torch.manual_seed(1)
    shared = nn.Linear(256, 512).to(torch.bfloat16)
    holder = nn.ModuleDict({"a": nn.Sequential(shared), "b": nn.Sequential(shared)})
    pack_linear_weights(holder)
    assert isinstance(holder["a"][0], BlockedLinear) and holder["a"][0] is holder["b"][0]


def test_a_blocked_layer_refuses_what_it_cannot_take(blocked_routes):
    net = _net()
    pack_linear_weights(net)
    layer = net[0].q
    with pytest.raises(TypeError, match=r"bfloat16 CPU inputs, got torch\.float32"):
        layer(torch.randn(1, 256))
    x = torch.randn(1, 256).to(torch.bfloat16).requires_grad_()
    with pytest.raises(RuntimeError, match="for inference"):
        layer(x)


def test_compiling_and_int8_take_blocked_layers_back(blocked_routes):
    from omni_core.engine.compiled import dense_linears
    from omni_core.engine.quantize import Int8Linear, quantize_linear_weights

    plain, net = _net(), _net()
    pack_linear_weights(net)
    assert dense_linears(net) == 3
    assert type(net[0].q) is RowLinear and torch.equal(net[0].q.weight, plain[0].q.weight)
    assert net[0].q.bias is not None and net[0].k.bias is None
    net = _net()
    pack_linear_weights(net)
    assert quantize_linear_weights(net, min_elements=4096) == 3
    assert isinstance(net[0].q, Int8Linear)
    torch.testing.assert_close(net[0].q.weight, plain[0].q.weight, atol=0.05, rtol=0.05)


def test_the_blocked_product_is_f_linear_at_every_row_count():
    torch.manual_seed(2)
    weight = torch.randn(384, 256).to(torch.bfloat16)
    blocked = cpu_linear.block_weight(weight)
    for rows in (1, 7, 64, 513):
        x = torch.randn(rows, 256).to(torch.bfloat16)
        got = torch.ops.mkldnn._linear_pointwise(x, blocked, None, "none", [], "")
        torch.testing.assert_close(got, F.linear(x, weight), **CLOSE)


@pytest.mark.parametrize("shape", [(1, 256), (2, 256), (1, 1, 256), (2, 1, 256), (5, 256)])
def test_a_padded_product_gives_the_rows_it_was_given(shape):
    """Fewer rows than ``min_rows`` run as that many and are cut back: same shape, same
    values (a row is its own product), bias added once; more rows run as they are."""
    torch.manual_seed(3)
    weight = torch.randn(384, 256).to(torch.bfloat16)
    bias = torch.randn(384).to(torch.bfloat16)
    blocked = cpu_linear.block_weight(weight)
    x = torch.randn(shape).to(torch.bfloat16)
    got = blocked_product(x, blocked, bias, min_rows=4)
    assert got.shape == (*shape[:-1], 384) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, weight, bias), **CLOSE)
    torch.testing.assert_close(got, blocked_product(x, blocked, bias), **CLOSE)


def test_blocked_layers_pad_where_the_routes_say_so(blocked_routes, monkeypatch):
    seen = []
    kernel = torch.ops.mkldnn._linear_pointwise

    def spy(x, *args):
        seen.append(x.shape[0])
        return kernel(x, *args)

    torch.manual_seed(4)
    layer = BlockedLinear(nn.Linear(256, 384, bias=False).to(torch.bfloat16))
    x = torch.randn(1, 256).to(torch.bfloat16)
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    plain = layer(x)
    monkeypatch.setattr(cpu_linear, "_routes", KernelChoice(0, False, 0, True, 4))
    padded = layer(x)
    assert seen == [1, 4]
    torch.testing.assert_close(padded, plain, **CLOSE)


class Attention(nn.Module):
    """q/k/v as the decoders name them: one blocked product where weights are blocked."""

    sibling_projections = (("q", "k", "v"),)
    blocked_siblings = sibling_projections

    def __init__(self, bias: bool = False) -> None:
        super().__init__()
        self.q = nn.Linear(256, 512, bias=bias)
        self.k = nn.Linear(256, 256, bias=bias)
        self.v = nn.Linear(256, 256, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(project(x, self.q, self.k, self.v), dim=-1)


def _attention(seed: int = 0, bias: bool = False) -> Attention:
    torch.manual_seed(seed)
    return Attention(bias).to(torch.bfloat16)


@pytest.mark.parametrize("bias", [False, True])
def test_a_named_group_is_one_blocked_product(blocked_routes, bias):
    plain, net = _attention(bias=bias), _attention(bias=bias)
    pack_linear_weights(net)
    assert all(type(layer) is BlockedRows for layer in (net.q, net.k, net.v))
    assert net.q.product is net.k.product is net.v.product
    assert net.q.product.out_features == 1024
    with torch.no_grad():
        for shape in [(1, 256), (8, 256), (2, 3, 256), (300, 256)]:
            x = torch.randn(*shape).to(torch.bfloat16)
            torch.testing.assert_close(net(x), plain(x), **CLOSE)
            # a member called alone computes its own rows
            torch.testing.assert_close(net.k(x), plain.k(x), **CLOSE)
    for name in ("q", "k", "v"):
        assert torch.equal(getattr(net, name).weight, getattr(plain, name).weight)
    expected = {"q.bias", "k.bias", "v.bias"} if bias else set()
    assert set(net.state_dict()) == expected  # weights leave it, as BlockedLinear's do
    assert pack_linear_weights(net) == 0 and net.q.product is net.v.product  # idempotent


def test_a_group_with_a_member_held_elsewhere_is_blocked_layer_by_layer(blocked_routes):
    net = _attention()
    net.v.weight.share_memory_()  # shared with other processes (weight sharing)
    pack_linear_weights(net)
    assert type(net.q) is BlockedLinear and type(net.k) is BlockedLinear
    assert type(net.v) is RowLinear and net.v.weight.is_shared()
    x = torch.randn(2, 256).to(torch.bfloat16)
    torch.testing.assert_close(net(x), _attention()(x), **CLOSE)


def test_groups_not_named_for_blocking_are_blocked_layer_by_layer(blocked_routes):
    net = _net()  # Block names q/k in sibling_projections only
    pack_linear_weights(net)
    assert type(net[0].q) is BlockedLinear and type(net[0].k) is BlockedLinear


def test_compiling_and_int8_take_a_blocked_group_back(blocked_routes):
    from omni_core.engine.compiled import dense_linears
    from omni_core.engine.quantize import Int8Linear, quantize_linear_weights

    plain, net = _attention(bias=True), _attention(bias=True)
    pack_linear_weights(net)
    assert dense_linears(net) == 3
    assert all(type(layer) is RowLinear for layer in (net.q, net.k, net.v))
    assert "_omni_fusion" in net.q.__dict__  # one dense product again, as packing fuses
    x = torch.randn(3, 256).to(torch.bfloat16)
    torch.testing.assert_close(net(x), plain(x), **CLOSE)
    assert torch.equal(net.k.bias, plain.k.bias)
    net = _attention()
    pack_linear_weights(net)
    # k and v alone are under the floor; the group's product is not: all three go
    assert quantize_linear_weights(net, min_elements=200_000) == 3
    assert all(isinstance(layer, Int8Linear) for layer in (net.q, net.k, net.v))
    torch.testing.assert_close(net(x), _attention()(x), atol=0.1, rtol=0.1)


# inductor builds the step cold (~18 s here); test_compiled.py's blocked bf16 case keeps
# compiling-with-blocked-layers in make test
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
@pytest.mark.parametrize("min_rows", [0, 4])
def test_a_compiled_step_keeps_the_blocked_products_and_their_numbers(
    blocked_routes, monkeypatch, min_rows
):
    """Compiling keeps the blocked layers (``omni::blocked_linear``) and equals eager."""
    import dataclasses

    from omni_core.engine.compiled import dense_linears

    monkeypatch.setattr(
        cpu_linear,
        "_routes",
        dataclasses.replace(cpu_linear.routes(), bf16_blocked=True, bf16_blocked_min_rows=min_rows),
    )
    net = _net()
    pack_linear_weights(net)
    assert dense_linears(net, keep_routed=True) == 0
    assert isinstance(net[0].q, BlockedLinear) and isinstance(net[0].out, BlockedLinear)
    torch._dynamo.reset()
    compiled = torch.compile(net, dynamic=False, fullgraph=True)
    with torch.no_grad():
        for rows in (1, 3, 8):
            x = torch.randn(rows, 256).to(torch.bfloat16)
            eager = net(x)
            torch.testing.assert_close(compiled(x), eager, atol=0, rtol=0)  # the same kernels
        # the compiled graph reaches the weight through its number, nowhere else
        from omni_core.engine import cpu_blocked_weight

        monkeypatch.delitem(cpu_blocked_weight._BLOCKED, int(net[0].out.handle))
        with pytest.raises(KeyError):
            compiled(x)


def test_dense_linears_may_keep_blocked_and_packed_float32_layers(blocked_routes):
    from omni_core.engine.compiled import dense_linears
    from omni_core.engine.cpu_linear import PackedLinear

    net = _net()
    pack_linear_weights(net)
    dense = nn.Linear(512, 512)
    net.append(PackedLinear(dense))
    assert dense_linears(net, keep_routed=True) == 0  # both call their kernels as they are
    assert isinstance(net[0].q, BlockedLinear) and isinstance(net[3], PackedLinear)
    assert dense_linears(net) == 4  # and without: the three blocked ones and the float32 one
    assert type(net[3]) is nn.Linear and torch.equal(net[3].weight, dense.weight)


def test_a_freed_blocked_layer_leaves_the_numbered_weights(blocked_routes):
    import gc

    from omni_core.engine import cpu_blocked_weight

    layer = BlockedLinear(nn.Linear(256, 512).to(torch.bfloat16))
    number = int(layer.handle)
    assert cpu_blocked_weight._BLOCKED[number] is layer
    del layer
    gc.collect()
    assert number not in cpu_blocked_weight._BLOCKED
