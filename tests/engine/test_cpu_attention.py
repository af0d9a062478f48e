"""Decode attention on the CPU in bf16 as two batched products (``cpu_attention``)."""

from __future__ import annotations

import gc
import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from omni_core.engine import cpu_attention  # noqa: E402
from omni_core.engine.cpu_attention import (  # noqa: E402
    GROUPED_MIN_KEYS,
    attention,
    attention_mode,
    fused_rows,
    grouped_decode,
    grouped_single_query,
)


def _inputs(batch, heads, kv_heads, steps, keys, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, steps, 64, generator=generator).to(dtype)
    k = torch.randn(batch, kv_heads, keys, 64, generator=generator).to(dtype)
    v = torch.randn(batch, kv_heads, keys, 64, generator=generator).to(dtype)
    return q, k, v


def _exact(q, k, v, mask):
    """The same attention in float64: what both forms approximate."""
    return F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )


@pytest.mark.parametrize("heads, kv_heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("masked", [False, True])
def test_grouped_form_is_attention_within_bf16_rounding(heads, kv_heads, masked):
    q, k, v = _inputs(3, heads, kv_heads, 1, 40, torch.bfloat16)
    mask = None
    if masked:
        mask = torch.rand(3, 1, 1, 40, generator=torch.Generator().manual_seed(1)) > 0.4
        mask[..., 0] = True  # every query sees a key, as the engines' masks guarantee
    got = grouped_single_query(q, k, v, mask)
    exact = _exact(q, k, v, mask)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=heads != kv_heads)
    assert got.shape == q.shape and got.dtype == torch.bfloat16
    # float32 products: no further from exact than the fused kernel (one bf16 rounding
    # of the output at most, where the fused kernel also rounds its probabilities)
    fused_error = (fused.double() - exact).abs().max().item()
    error = (got.double() - exact).abs().max().item()
    ulp = exact.abs().max().item() * 2**-8
    assert error <= max(fused_error, ulp)


def test_hidden_keys_weigh_nothing():
    q, k, v = _inputs(2, 4, 2, 1, 48, torch.bfloat16)
    mask = torch.ones(2, 1, 1, 48, dtype=torch.bool)
    mask[0, ..., 20:] = False
    mask[1, ..., :5] = False
    poisoned = v.clone()
    poisoned[0, :, 20:] = 1e4  # what row 0 must not see
    poisoned[1, :, :5] = -1e4
    torch.testing.assert_close(
        grouped_single_query(q, k, poisoned, mask), grouped_single_query(q, k, v, mask)
    )


def _set_mode(monkeypatch, mode):
    """OMNI_CPU_ATTENTION=mode (None: unset) for the test; read once per process, so re-read."""
    if mode is None:
        monkeypatch.delenv("OMNI_CPU_ATTENTION", raising=False)
    else:
        monkeypatch.setenv("OMNI_CPU_ATTENTION", mode)
    monkeypatch.setattr(cpu_attention, "_mode", None)


@pytest.fixture
def grouped(monkeypatch):
    _set_mode(monkeypatch, "grouped")


def test_the_grouped_form_is_the_eager_default_and_fused_is_the_references_kernel(monkeypatch):
    _set_mode(monkeypatch, None)
    assert attention_mode() == "auto"
    q, k, v = _inputs(2, 8, 2, 1, 64, torch.bfloat16)
    assert torch.equal(attention(q, k, v, None), grouped_single_query(q, k, v, None))
    _set_mode(monkeypatch, "fused")
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.equal(attention(q, k, v, None), expected)  # bit-equal to the references


def test_an_unknown_mode_is_refused_naming_the_variable(monkeypatch):
    _set_mode(monkeypatch, "fast")
    with pytest.raises(
        ValueError, match=r"OMNI_CPU_ATTENTION='fast': use one of auto, fused, grouped"
    ):
        attention_mode()


def _traced_calls(q, k, v, mask):
    """The operators a compiled ``attention`` call runs (dynamo's graph, eager backend)."""
    graphs = []

    def keep(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    out = torch.compile(attention, fullgraph=True, backend=keep)(q, k, v, mask)
    targets = [str(node.target) for g in graphs for node in g.graph.nodes]
    return out, targets


@pytest.mark.parametrize("mode", [None, "auto", "grouped"])
def test_a_compiled_decode_step_takes_the_grouped_form_through_its_operator(monkeypatch, mode):
    """Compiled (unset, auto or grouped): the grouped form as one opaque operator, its
    numbers exactly the eager grouped form's, within bf16 rounding of the fused kernel's."""
    _set_mode(monkeypatch, mode)
    q, k, v = _inputs(2, 8, 2, 1, 48, torch.bfloat16)
    mask = torch.ones(2, 1, 1, 48, dtype=torch.bool)
    mask[0, ..., 20:] = False  # a static span: row 0's slot is shorter
    out, targets = _traced_calls(q, k, v, mask)
    assert "omni.grouped_attention" in targets
    assert not any("scaled_dot_product" in t for t in targets)
    assert torch.equal(out, grouped_single_query(q, k, v, mask))
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, fused, atol=2e-2, rtol=2e-2)


def test_fused_keeps_the_fused_kernel_in_compiled_steps_too(monkeypatch):
    _set_mode(monkeypatch, "fused")
    q, k, v = _inputs(2, 8, 2, 1, 48, torch.bfloat16)
    out, targets = _traced_calls(q, k, v, None)
    assert not any("grouped_attention" in t for t in targets)
    assert any("scaled_dot_product" in t for t in targets)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
def test_the_operator_is_inductor_safe_and_equal_to_eager(monkeypatch):
    """Through inductor too (what the engine compiles with): the fake gives the shape."""
    _set_mode(monkeypatch, None)
    q, k, v = _inputs(4, 8, 2, 1, 40, torch.bfloat16)
    mask = torch.ones(4, 1, 1, 40, dtype=torch.bool).tril(-1)[:, :, :1].expand(4, 1, 1, 40)
    mask = mask.clone()
    mask[:, ..., :3] = True
    torch._dynamo.reset()
    compiled = torch.compile(attention, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(q, k, v, mask), grouped_single_query(q, k, v, mask))


def test_a_compiled_step_takes_the_switch_as_a_constant(grouped):
    """No graph break and no dynamo warning around the switch (a compiled decode step)."""
    q, k, v = _inputs(2, 8, 2, 1, GROUPED_MIN_KEYS, torch.bfloat16)
    mask = torch.ones(2, 1, 1, GROUPED_MIN_KEYS, dtype=torch.bool)
    eager = attention(q, k, v, mask)
    compiled = torch.compile(attention, fullgraph=True, backend="eager")
    gc.collect()  # other tests' garbage, whose ResourceWarnings are not this test's
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # what dynamo warns with
        assert torch.equal(compiled(q, k, v, mask), eager)


@pytest.mark.parametrize("mode", [None, "auto", "grouped"])
def test_bf16_decode_steps_take_the_grouped_form(monkeypatch, mode):
    _set_mode(monkeypatch, mode)
    q, k, v = _inputs(2, 8, 2, 1, GROUPED_MIN_KEYS, torch.bfloat16)
    mask = torch.ones(2, 1, 1, GROUPED_MIN_KEYS, dtype=torch.bool)
    assert torch.equal(attention(q, k, v, mask), grouped_single_query(q, k, v, mask))


@pytest.mark.parametrize(
    "dtype, steps, keys",
    [
        (torch.float32, 1, 64),  # float32 stays the fused kernel: exact as before
        (torch.bfloat16, 4, 64),  # a prompt's several positions
        (torch.bfloat16, 1, GROUPED_MIN_KEYS // 2 - 1),  # too few keys to gain
    ],
)
def test_other_shapes_keep_the_fused_kernel(grouped, dtype, steps, keys):
    q, k, v = _inputs(2, 8, 2, steps, keys, dtype)
    mask = torch.ones(2, 1, steps, keys, dtype=torch.bool).tril(keys - steps)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.equal(attention(q, k, v, mask), expected)


def _ragged_prefill(dtype):
    """Two prompts in one prefill: 1100 new positions from 0, 900 from 300 (padded)."""
    from omni_qwen3_tts.layers import causal_mask

    q, k, v = _inputs(2, 8, 2, 1100, 1400, dtype, seed=3)
    mask = causal_mask(torch.tensor([0, 300]), torch.tensor([1100, 900]), 1100, 1400)
    return q, k, v, mask


def test_a_long_bf16_prefill_runs_in_tiles_over_the_keys_each_sees(monkeypatch):
    q, k, v, mask = _ragged_prefill(torch.bfloat16)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    exact = _exact(q, k, v, mask)
    keys = []
    fused = F.scaled_dot_product_attention

    def counting(q, k, v, **kwargs):
        keys.append((q.shape[2], k.shape[2]))
        return fused(q, k, v, **kwargs)

    monkeypatch.setattr(cpu_attention.F, "scaled_dot_product_attention", counting)
    tiled = attention(q, k, v, mask)
    # bf16 rounding apart from the single call (the kernel blocks by key count), and as
    # close to the exact attention
    assert (tiled.double() - expected.double()).abs().max() <= 2**-10
    whole_error = (expected.double() - exact).abs().max()
    assert (tiled.double() - exact).abs().max() <= whole_error + 2**-10
    tile = cpu_attention.PREFILL_TILE
    # the second row's queries sit at 300 + i and its keys end at 1200: tile one sees
    # keys to 300 + 511, the others to 1199 (of the 1400 the call was given)
    assert keys == [(tile, 300 + tile), (tile, 1200), (1100 - 2 * tile, 1200)]


def test_a_long_float32_prefill_keeps_the_single_call(monkeypatch):
    q, k, v, mask = _ragged_prefill(torch.float32)
    calls = []
    fused = F.scaled_dot_product_attention

    def counting(q, k, v, **kwargs):
        calls.append(k.shape[2])
        return fused(q, k, v, **kwargs)

    monkeypatch.setattr(cpu_attention.F, "scaled_dot_product_attention", counting)
    attention(q, k, v, mask)
    assert calls == [1400]


@pytest.mark.parametrize(
    "batch, heads, kv_heads, keys, form",
    [
        (8, 16, 8, 17, "products"),  # little work in pairs: a code predictor at c=8
        (8, 16, 8, 64, "products"),
        (1, 16, 8, 17, "rows"),  # one sequence: the kernel's single call
        (8, 16, 8, 240, "rows"),  # more than a little work
        (8, 32, 4, 17, "rows"),  # groups of 8 read each key once for 8 query heads
        (8, 8, 8, 240, "products"),  # one query head a KV head: the kernel's slow shape
    ],
)
def test_decode_attention_takes_the_form_that_pays(monkeypatch, batch, heads, kv_heads, keys, form):
    q, k, v = _inputs(batch, heads, kv_heads, 1, keys, torch.bfloat16)
    mask = torch.ones(batch, 1, 1, keys, dtype=torch.bool)
    assert cpu_attention.decode_form(batch, heads, kv_heads, keys) == form
    taken = []
    for name in ("fused_rows", "grouped_single_query"):
        real = getattr(cpu_attention, name)
        monkeypatch.setattr(
            cpu_attention, name, lambda *a, _r=real, _n=name: taken.append(_n) or _r(*a)
        )
    grouped_decode(q, k, v, mask)
    assert taken == ["fused_rows" if form == "rows" else "grouped_single_query"]


def test_fused_rows_are_the_kernels_numerics_for_every_query_head():
    """Each KV head's query heads as the kernel's query rows: the per-head call's numbers
    (the references' kernel) within a bf16 rounding, and as close to the exact attention."""
    q, k, v = _inputs(8, 32, 4, 1, 300, torch.bfloat16, seed=6)
    mask = torch.rand(8, 1, 1, 300, generator=torch.Generator().manual_seed(2)) > 0.3
    mask[..., 0] = True
    got = fused_rows(q, k, v, mask)
    per_head = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    exact = _exact(q, k, v, mask)
    assert (got.double() - per_head.double()).abs().max() <= 2**-8
    assert (got.double() - exact).abs().max() <= (per_head.double() - exact).abs().max() + 2**-9


def test_grouped_products_take_many_long_sequences_a_few_at_a_time(monkeypatch):
    """The float32 copies of many long sequences' keys stay small: chunks of sequences give
    the same numbers as all at once."""
    q, k, v = _inputs(6, 4, 4, 1, 100, torch.bfloat16, seed=7)
    mask = torch.ones(6, 1, 1, 100, dtype=torch.bool)
    mask[2, ..., 60:] = False
    whole = grouped_single_query(q, k, v, mask)
    monkeypatch.setattr(cpu_attention, "GROUPED_CHUNK_BYTES", 4 * 100 * 64 * 4 * 2)  # 2 rows
    assert torch.equal(grouped_single_query(q, k, v, mask), whole)
    broadcast = torch.ones(1, 1, 1, 100, dtype=torch.bool)  # one mask for every sequence
    assert torch.equal(
        grouped_single_query(q, k, v, broadcast), grouped_single_query(q, k, v, None)
    )
