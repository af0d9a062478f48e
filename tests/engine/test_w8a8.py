"""w8a8_int8 linear layers (omni_core.engine.w8a8): int8 weights and per-row int8 activations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from omni_core.engine.cpu_blocked_weight import blocking_available
from omni_core.engine.cpu_linear import BlockedRows, block_as_one
from omni_core.engine.fused_linear import project
from omni_core.engine.quantize import apply_quantization, quantization_problem
from omni_core.engine.w8a8 import W8A8Linear, W8A8Rows, quantize_rows, w8a8_problem

pytestmark = pytest.mark.skipif(
    w8a8_problem() is not None, reason=f"no int8 products here: {w8a8_problem()}"
)


def _linear(k: int, n: int, bias: bool = False, dtype=torch.float32, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias).to(dtype)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_w8a8_layer_matches_its_float_layer_within_quantization_error(dtype):
    dense = _linear(256, 96, bias=True, dtype=dtype)
    layer = W8A8Linear(dense.weight, dense.bias)
    x = torch.randn(3, 5, 256).to(dtype)
    with torch.no_grad():
        want, got = dense(x), layer(x)
        weight = dense.weight.detach()
    assert got.shape == (3, 5, 96) and got.dtype is dtype
    # half a step of max|x|/127 per activation and of max|w|/127 per weight: ~1 % here
    assert _relative_error(got, want) < 0.03
    assert not torch.equal(got, want)  # the int8 kernel, not the float weight
    assert _relative_error(layer.weight, weight) < 0.01
    assert layer(x[:0]).shape == (0, 5, 96)


def test_each_rows_result_is_its_own_whatever_its_batch():
    """One scale per row: a neighbour with outliers leaves a row's result bit for bit."""
    layer = W8A8Linear(_linear(128, 64).weight, None)
    x = torch.randn(4, 128)
    alone = layer(x[:1])
    loud = x.clone()
    loud[1:] *= 1000.0
    assert torch.equal(layer(loud)[:1], alone)
    assert torch.equal(layer(x)[:1], alone)


def test_a_layer_whose_buffers_were_replaced_computes_with_the_new_ones():
    """oneDNN's arguments are kept between calls; replacing a buffer must not leave them stale."""
    layer = W8A8Linear(_linear(128, 64).weight, None)
    x = torch.randn(2, 128)
    before = layer(x)
    layer.scales = layer.scales * 2  # a new tensor, as .to() or a loader may make
    assert torch.equal(layer(x), before * 2)  # a power of two: exact
    assert layer.onednn_arguments() is layer.onednn_arguments()  # kept while unchanged


def test_rows_are_quantised_symmetrically_in_float32():
    x = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    quantized, scales = quantize_rows(x)
    assert quantized.dtype is torch.uint8 and scales.dtype is torch.float32
    # unsigned, shifted by 128; round(0.5 * 127) = 64 (half to even)
    assert quantized[0].tolist() == [128 + 64, 128 - 127, 128 + 32]
    assert quantized[1].tolist() == [128, 128, 128]  # a row of zeros stays zeros
    values = torch.randn(2, 8)
    before = values.clone()
    quantize_rows(values)
    assert torch.equal(values, before)  # the caller's float32 rows are not changed


class _Attention(nn.Module):
    """Three projections of one input, named as the model plugins name theirs."""

    sibling_projections = (("q_proj", "k_proj", "v_proj"),)
    blocked_siblings = sibling_projections

    def __init__(self, dtype, bias: bool = False):
        super().__init__()
        self.q_proj = _linear(64, 64, bias, dtype, seed=1)
        self.k_proj = _linear(64, 32, bias, dtype, seed=2)
        self.v_proj = _linear(64, 32, bias, dtype, seed=3)
        self.o_proj = _linear(64, 64, False, dtype, seed=4)


@pytest.mark.parametrize(
    ("dtype", "pack"), [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)]
)
def test_sibling_projections_become_one_product_that_quantises_their_input_once(dtype, pack):
    module = _Attention(dtype, bias=True)
    x = torch.randn(3, 64).to(dtype)
    with torch.no_grad():
        want = [module.q_proj(x), module.k_proj(x), module.v_proj(x)]
        if pack:  # bf16 stages block q/k/v as one oneDNN product first (pack_linear_weights)
            if not blocking_available():
                pytest.skip("no blocked bf16 products on this CPU")
            block_as_one(module, ("q_proj", "k_proj", "v_proj"))
            assert isinstance(module.q_proj, BlockedRows)
        converted = apply_quantization(module, "w8a8_int8", stage="tts_engine")
        assert converted == 2  # q/k/v as one product, o_proj alone
        members = (module.q_proj, module.k_proj, module.v_proj)
        assert all(isinstance(m, W8A8Rows) for m in members)
        assert len({id(m.product) for m in members}) == 1
        assert isinstance(module.o_proj, W8A8Linear)
        calls = []
        product = members[0].product
        original = product.product
        product.product = lambda *a: calls.append(1) or original(*a)
        got = project(x, *members)
        assert len(calls) == 1  # one quantised input, one int8 product for the three
        alone = [m(x) for m in members]
    for g, a, w in zip(got, alone, want, strict=True):
        assert g.dtype is dtype and torch.equal(g, a)
        assert _relative_error(g, w) < 0.03
    assert apply_quantization(module, "w8a8_int8", stage="tts_engine") == 0  # idempotent


def test_float32_stages_are_converted_and_heads_are_not():
    model = nn.Module()
    model.body = nn.Sequential(_linear(64, 256), _linear(256, 64))
    model.codec_head = _linear(64, 512)
    assert apply_quantization(model, "w8a8_int8", stage="tts_engine") == 2
    assert all(isinstance(m, W8A8Linear) for m in model.body)
    assert type(model.codec_head) is nn.Linear


def test_a_compiled_call_equals_the_eager_one():
    layer = W8A8Linear(_linear(64, 48, bias=True).weight, torch.randn(48))
    model = nn.Sequential(layer, nn.GELU())
    x = torch.randn(2, 64)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_compiled_step_quantises_rows_in_its_graph_and_calls_onednn_alone(dtype):
    """The quantisation is traced (inductor fuses it with the norm before it); the operator
    of ours gets the unsigned bytes and returns the unscaled product. Inductor's code
    equals eager within float rounding."""
    layer = W8A8Linear(_linear(64, 48).weight, torch.randn(48).to(dtype))
    model = nn.Sequential(nn.LayerNorm(64).to(dtype), layer, nn.GELU())
    graphs: list[torch.fx.GraphModule] = []

    def record(graph, example):
        graphs.append(graph)
        return graph.forward

    x = torch.randn(3, 64).to(dtype)
    with torch.no_grad():
        eager = model(x)
        traced = torch.compile(model, backend=record, fullgraph=True)(x)
        compiled = torch.compile(model, fullgraph=True)(x)
    nodes = graphs[0].graph.nodes
    calls = [str(n.target) for n in nodes if n.op in ("call_function", "call_method")]
    assert "omni.w8a8_product" in calls
    assert "amax" in calls and "round_" in calls  # the rows' quantisation, in the graph
    assert torch.equal(traced, eager)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(compiled.float(), eager.float(), atol=tolerance, rtol=tolerance)


def test_a_cpu_that_is_not_x86_is_refused(monkeypatch):
    from omni_core.engine import w8a8

    monkeypatch.setattr(w8a8.platform, "machine", lambda: "aarch64")
    w8a8._w8a8_problem.cache_clear()
    try:
        assert "built for x86-64 CPUs, and this is aarch64" in w8a8.w8a8_problem()
    finally:
        monkeypatch.undo()
        w8a8._w8a8_problem.cache_clear()
    assert w8a8.w8a8_problem() is None


def test_what_cannot_run_is_refused_with_the_fix():
    assert "not implemented yet on CUDA" in quantization_problem(
        "w8a8_int8", torch.bfloat16, torch.device("cuda", 0)
    )
    assert 'factory.dtype = "bfloat16" or "float32"' in quantization_problem(
        "w8a8_int8", torch.float16, torch.device("cpu")
    )
    assert quantization_problem("w8a8_int8", torch.float32, torch.device("cpu")) is None
    with pytest.raises(ValueError, match=r"stage 'thinker': factory\.quantization = 'w8a8_int8'"):
        apply_quantization(_linear(4, 4, dtype=torch.float16), "w8a8_int8", stage="thinker")


def test_moss_tts_backbone_in_w8a8_stays_close_to_float32_teacher_forced():
    """The same 40 positions through both backbones (causal, no cache): last hidden states."""
    from omni_moss_tts.model import MossTTSModel

    reference = MossTTSModel.from_pretrained("tiny", load_format="dummy", dtype="float32")
    model = MossTTSModel.from_pretrained("tiny", load_format="dummy", dtype="float32")
    stack = model.network.language_model
    assert apply_quantization(stack, "w8a8_int8", stage="tts_engine") > 0
    assert any(isinstance(m, W8A8Linear) for m in stack.modules())
    steps, hidden = 40, stack.norm.weight.shape[0]
    torch.manual_seed(0)
    x = torch.randn(1, steps, hidden)
    positions = torch.arange(steps)[None]
    mask = torch.ones(steps, steps, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        want = reference.network.language_model(x, positions, mask, None)
        got = stack(x, positions, mask, None)
    # measured 1.0-2.3 % per position (median 1.5) on the tiny preset, 2 layers
    errors = (got - want).norm(dim=-1) / want.norm(dim=-1)
    assert float(errors.max()) < 0.05, errors
    assert float(errors.max()) > 0  # the int8 products ran
