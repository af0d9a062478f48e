"""Linear layers repacked for oneDNN: same outputs, only the eligible layers, idempotent."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from omni_core.engine.cpu_linear import (  # noqa: E402
    ROW_MIN_ELEMENTS,
    TRANSPOSED_MAX_ROWS,
    PackedLinear,
    RowLinear,
    float32_matmul,
    linear_gelu,
    pack_linear_weights,
    packing_available,
    row_linear,
)

pytestmark = pytest.mark.skipif(not packing_available(), reason="torch built without oneDNN")


def _net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(64, 256),  # 16384 elements, with bias
        nn.SiLU(),
        nn.Linear(256, 64, bias=False),  # 16384 elements, no bias
        nn.Linear(64, 8),  # 512 elements: below the threshold used here
    )


def test_packed_layers_compute_what_the_dense_ones_did():
    dense = _net()
    packed = _net()
    assert pack_linear_weights(packed, min_elements=1000) == 2
    assert [type(m).__name__ for m in packed] == ["PackedLinear", "SiLU", "PackedLinear", "Linear"]
    with torch.no_grad():
        for shape in [(1, 64), (8, 64), (3, 5, 64), (0, 64)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(packed(x), dense(x), atol=1e-5, rtol=1e-5)
        strided = torch.randn(5, 3, 64).transpose(0, 1)  # not contiguous
        torch.testing.assert_close(packed(strided), dense(strided), atol=1e-5, rtol=1e-5)


def test_packing_twice_packs_nothing_new_and_weights_stay_readable():
    net = _net()
    original = net[0].weight.detach().clone()
    assert pack_linear_weights(net, min_elements=1000) == 2
    assert pack_linear_weights(net, min_elements=1000) == 0
    assert torch.equal(net[0].weight, original)
    assert "rows<=3: MKL, more: oneDNN" in repr(net[0])
    # The packed weight leaves state_dict: a checkpoint must be saved before packing.
    assert "0.weight" not in net.state_dict() and "0.bias" in net.state_dict()


def _onednn_rows(monkeypatch) -> list[int]:
    """The row counts of oneDNN's float32 products from now on (its op wrapped, counted)."""
    calls: list[int] = []
    onednn = torch.ops.mkldnn._linear_pointwise

    def counted(x, *args):
        calls.append(x.shape[0])
        return onednn(x, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counted)
    return calls


def test_few_rows_go_to_mkl_and_more_to_onednn(monkeypatch):
    dense = _net()[0]
    routed = PackedLinear(dense)
    assert routed.packed.data_ptr() == dense.weight.data_ptr()  # no copy of the weight
    calls = _onednn_rows(monkeypatch)
    with torch.no_grad():
        for rows in (1, 3, 4, 9):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(routed(x), dense(x), atol=1e-5, rtol=1e-5)
    assert calls == [4, 9]  # one to three rows never reached oneDNN


def test_linear_gelu_is_the_product_then_gelu_bit_for_bit(monkeypatch):
    calls: list[str] = []
    onednn = torch.ops.mkldnn._linear_pointwise

    def counted(x, weight, bias, attr, *args):
        calls.append(attr)
        return onednn(x, weight, bias, attr, *args)

    for bias in (True, False):
        torch.manual_seed(3)
        dense = nn.Linear(96, 384, bias=bias)
        routed = PackedLinear(dense)
        with torch.no_grad():
            for shape in [(2, 96), (4, 96), (3, 70, 96), (2, 5, 7, 96)]:
                x = torch.randn(*shape) * 3  # values across the GELU's whole bend
                expected = F.gelu(routed(x))
                calls.clear()
                monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counted)
                got = linear_gelu(routed, x)
                monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", onednn)
                assert torch.equal(got, expected), (bias, shape)
                # one fused call on oneDNN's route; MKL's few rows keep the two calls
                rows = x.numel() // 96
                assert calls == (["gelu"] if rows > routed.mkl_rows else []), shape
            # a plain layer, a bf16 input, or a gradient wanted: the two calls, as before
            torch.testing.assert_close(linear_gelu(dense, x), F.gelu(dense(x)))
    bf16 = nn.Linear(96, 384).to(torch.bfloat16)
    x = torch.randn(8, 96).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(linear_gelu(bf16, x), F.gelu(bf16(x)))


def test_float32_matmul_takes_onednn_past_the_mkl_rows_and_equals_mm(monkeypatch):
    calls: list[tuple[int, ...]] = []
    onednn = torch.ops.mkldnn._linear_pointwise

    def counted(x, weight, *args):
        calls.append(tuple(weight.shape))
        return onednn(x, weight, *args)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counted)
    torch.manual_seed(4)
    weight = torch.randn(96, 160)  # [K, N], read transposed in place
    with torch.no_grad():
        for rows in (1, 3, 4, 37):
            x = torch.randn(rows, 96)
            torch.testing.assert_close(float32_matmul(x, weight), x @ weight, rtol=1e-5, atol=1e-5)
        assert calls == [(160, 96), (160, 96)]  # 4 and 37 rows; 1-3 stayed on torch.mm
        calls.clear()
        half = weight.to(torch.bfloat16)
        x = torch.randn(8, 96).to(torch.bfloat16)
        assert torch.equal(float32_matmul(x, half), torch.mm(x, half)) and not calls


def test_non_float32_layers_are_left_alone():
    net = _net().to(torch.float64)
    assert pack_linear_weights(net, min_elements=0) == 0


def _bf16_net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(256, 512),  # 131072 elements, with bias
        nn.SiLU(),
        nn.Linear(512, 256, bias=False),
        nn.Linear(256, 8),  # 2048 elements: below ROW_MIN_ELEMENTS, left as it is
    ).to(torch.bfloat16)


def test_bf16_layers_route_a_lone_row_to_mv_and_keep_their_weights():
    plain = _bf16_net()
    routed = _bf16_net()
    weights = [m.weight for m in routed if isinstance(m, nn.Linear)]
    assert 256 * 8 < ROW_MIN_ELEMENTS <= 256 * 512
    assert pack_linear_weights(routed, skip=lambda name: True) == 2  # skip is for packing
    assert [type(m).__name__ for m in routed] == ["RowLinear", "SiLU", "RowLinear", "Linear"]
    assert [m.weight for m in routed if isinstance(m, nn.Linear)] == weights  # same tensors
    assert list(routed.state_dict()) == list(plain.state_dict())
    with torch.no_grad():
        for shape in [(1, 256), (1, 1, 256), (256,), (4, 256), (2, 3, 256), (0, 256)]:
            x = torch.randn(*shape).to(torch.bfloat16)
            out = routed(x)
            assert out.shape == plain(x).shape and out.dtype == torch.bfloat16
            # mv and F.linear both accumulate in float32: at most a bf16 rounding apart
            torch.testing.assert_close(out, plain(x), atol=2e-2, rtol=1e-2)
        row = torch.randn(1, 256).to(torch.bfloat16)
        first = routed[0]
        assert isinstance(first, RowLinear)
        expected = torch.mv(first.weight, row[0]) + first.bias
        torch.testing.assert_close(first(row)[0], expected, atol=0, rtol=0)  # the mv route
        rows = torch.randn(2, 3, 256).to(torch.bfloat16)
        expected = torch.mm(first.weight, rows.reshape(6, 256).t()).t() + first.bias
        torch.testing.assert_close(first(rows).reshape(6, -1), expected, atol=0, rtol=0)  # mm
    assert pack_linear_weights(routed) == 0  # idempotent


def test_a_routed_layer_is_still_quantized_to_int8():
    from omni_core.engine.quantize import Int8Linear, quantize_linear_weights

    net = _bf16_net()
    pack_linear_weights(net)
    assert quantize_linear_weights(net, min_elements=4096) == 2  # the 2048-element one stays
    assert [type(m).__name__ for m in net][:3] == ["Int8Linear", "SiLU", "Int8Linear"]
    assert isinstance(net[0], Int8Linear)


def test_a_packed_layer_refuses_inputs_it_cannot_take():
    layer = PackedLinear(nn.Linear(4, 4))
    with pytest.raises(TypeError, match=r"float32 CPU inputs, got torch\.float64"):
        layer(torch.zeros(2, 4, dtype=torch.float64))


def test_a_layer_shared_by_two_parents_is_packed_once_and_stays_shared():
    shared = nn.Linear(64, 64)
    net = nn.ModuleDict({"a": nn.Sequential(shared), "b": nn.Sequential(shared)})
    assert pack_linear_weights(net, min_elements=0) == 1
    assert isinstance(net["a"][0], PackedLinear) and net["a"][0] is net["b"][0]


def test_a_packed_layer_refuses_to_silently_drop_a_gradient():
    layer = PackedLinear(nn.Linear(4, 4))
    with pytest.raises(RuntimeError, match="for inference: it has no gradient"):
        layer(torch.zeros(2, 4, requires_grad=True))
    with torch.no_grad():
        assert layer(torch.zeros(2, 4, requires_grad=True)).shape == (2, 4)


def test_skip_leaves_the_named_layers_dense():
    from torch import nn

    from omni_core.engine.cpu_linear import PackedLinear, pack_linear_weights, packing_available

    if not packing_available():
        pytest.skip("this torch build cannot run packed layers")
    model = nn.ModuleDict(
        {
            "attn": nn.Linear(64, 64),
            "experts": nn.ModuleList([nn.Linear(64, 64), nn.Linear(64, 64)]),
        }
    )
    packed = pack_linear_weights(
        model, min_elements=1, skip=lambda name: name.startswith("experts.")
    )
    assert packed == 1
    assert isinstance(model["attn"], PackedLinear)
    assert all(type(e) is nn.Linear for e in model["experts"])


def test_several_rows_come_back_row_major():
    """A strided last dimension would follow the result into attention and unfuse it."""
    layer = _bf16_net()[0]
    pack_linear_weights(layer)
    with torch.no_grad():
        out = layer(torch.randn(3, 256).to(torch.bfloat16))
    assert out.is_contiguous() and out.stride(-1) == 1


def test_a_compiled_step_calls_the_routed_kernels_as_one_operator():
    """Inductor would write its own (slower) loop for the product; the operator keeps ours."""
    net = _bf16_net()
    pack_linear_weights(net)
    graphs: list[Any] = []

    def capture(graph: Any, inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    for rows in (1, 4):
        x = torch.randn(rows, 256).to(torch.bfloat16)
        with torch.no_grad():
            want = net(x)
            torch._dynamo.reset()
            got = torch.compile(net, backend=capture, dynamic=False)(x)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        targets = [str(n.target) for n in graphs[-1].graph.nodes if n.op == "call_function"]
        assert targets.count("omni.row_product") == 2, targets


def test_a_compiled_step_takes_the_float32_route_of_its_batch(monkeypatch):
    """A packed float32 layer in a compiled step is one operator, ``omni::packed_linear``,
    that sends a few rows to MKL and more to oneDNN as eagerly (inductor would give
    every batch to MKL), and computes what eager does."""
    dense = _net()[0]
    routed = PackedLinear(dense)
    graphs: list[Any] = []

    def capture(graph: Any, inputs: Any) -> Any:
        graphs.append(graph)
        return graph.forward

    xs = [torch.randn(rows, 64) for rows in (1, 8)]
    with torch.no_grad():  # inductor's code, before the count below replaces oneDNN's op
        inductor = [torch.compile(routed, dynamic=False)(x) for x in xs]
    calls = _onednn_rows(monkeypatch)
    for x, compiled in zip(xs, inductor, strict=True):
        with torch.no_grad():
            want = routed(x)
            torch._dynamo.reset()
            got = torch.compile(routed, backend=capture, dynamic=False)(x)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        torch.testing.assert_close(compiled, want, atol=1e-6, rtol=1e-6)
        targets = [str(n.target) for n in graphs[-1].graph.nodes if n.op == "call_function"]
        assert targets == ["omni.packed_linear"], targets
    assert calls == [8, 8]  # eager's and the traced step's eight rows; one row never


def _aten_calls(fn: Any) -> set[str]:
    """The aten operators ``fn()`` runs."""
    with torch.profiler.profile() as profile:
        fn()
    return {event.key.removeprefix("aten::") for event in profile.key_averages()}


def test_row_linear_takes_the_routed_kernels_for_bf16_and_leaves_the_rest_to_f_linear():
    """A product that is no layer of its own (stacked heads) gets RowLinear's kernels."""
    torch.manual_seed(0)
    weight = torch.randn(96, 256).to(torch.bfloat16)
    bias = torch.randn(96).to(torch.bfloat16)
    with torch.no_grad():
        for shape in [(1, 256), (256,), (1, 1, 256), (8, 256), (2, 3, 256)]:
            x = torch.randn(*shape).to(torch.bfloat16)
            out = row_linear(x, weight, bias)
            assert out.shape == (*shape[:-1], 96) and out.is_contiguous()
            torch.testing.assert_close(out, F.linear(x, weight, bias), atol=2e-2, rtol=1e-2)
        one, many = torch.randn(1, 256).to(torch.bfloat16), torch.randn(8, 256).to(torch.bfloat16)
        assert "mv" in _aten_calls(lambda: row_linear(one, weight))
        routed = _aten_calls(lambda: row_linear(many, weight))
        assert "mm" in routed and "addmm" not in routed and "linear" not in routed
        # the transposed product, bit for bit
        expected = torch.mm(weight, many.t()).t()
        torch.testing.assert_close(row_linear(many, weight), expected, atol=0, rtol=0)
        # a prompt's many rows: F.linear, which is the faster there
        prompt = torch.randn(TRANSPOSED_MAX_ROWS + 1, 256).to(torch.bfloat16)
        assert torch.equal(row_linear(prompt, weight, bias), F.linear(prompt, weight, bias))
        assert "linear" in _aten_calls(lambda: row_linear(prompt, weight))
        edge = torch.randn(TRANSPOSED_MAX_ROWS, 256).to(torch.bfloat16)
        assert "linear" not in _aten_calls(lambda: row_linear(edge, weight))
        plain = torch.randn(3, 256)
        assert torch.equal(row_linear(plain, weight.float()), plain @ weight.float().T)
        assert "mv" not in _aten_calls(lambda: row_linear(plain[:1], weight.float()))


def test_row_linear_gives_float32_rows_past_mkls_limit_to_onednn(monkeypatch):
    """Stacked float32 heads (MOSS-TTS's 32 audio heads) take PackedLinear's routes: MKL
    reads them at half the speed from four rows on. A slice of the stack, as a step's due
    heads, is read in place."""
    torch.manual_seed(0)
    stack = torch.randn(4, 96, 256)
    due = stack[1:3].flatten(0, 1)
    calls = _onednn_rows(monkeypatch)
    with torch.no_grad():
        for rows in (1, 3, 4, 8):
            x = torch.randn(rows, 256)
            torch.testing.assert_close(row_linear(x, due), x @ due.T, atol=1e-5, rtol=1e-5)
    assert calls == [4, 8]
    assert torch.equal(row_linear(torch.ones(2, 256), due), F.linear(torch.ones(2, 256), due))
    needs_grad = torch.randn(8, 256, requires_grad=True)
    assert row_linear(needs_grad, due).requires_grad and calls == [4, 8]  # F.linear, untouched
