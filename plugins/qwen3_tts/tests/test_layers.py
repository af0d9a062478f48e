"""The shared decoder layers: grouped-query attention reads shared keys in place, exactly."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from omni_qwen3_tts.layers import Attention, rope_cos_sin  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_heads_equal_heads_given_repeated_keys_bit_for_bit(dtype, monkeypatch):
    torch.manual_seed(0)
    attn = Attention(hidden=64, heads=8, kv_heads=2, head_dim=16, layer=0).to(dtype)
    x = torch.randn(2, 5, 64, dtype=dtype)
    positions = torch.arange(5)[None].expand(2, 5)
    cos, sin = rope_cos_sin(positions, 1.0 / (10000 ** (torch.arange(0, 16, 2) / 16)), dtype)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    captured = {}
    original = F.scaled_dot_product_attention

    def repeated(q, k, v, attn_mask=None, enable_gqa=False):
        captured["grouped"] = enable_gqa
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return original(q, k, v, attn_mask=attn_mask)

    with torch.no_grad():
        grouped = attn(x, cos, sin, mask)
        monkeypatch.setattr(F, "scaled_dot_product_attention", repeated)
        expected = attn(x, cos, sin, mask)
    assert captured["grouped"] is True
    assert torch.equal(grouped, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 1024), (8, 1, 2048), (2, 16, 3, 128), (4, 3, 100)])
def test_the_norm_equals_the_releases_float32_ops_bit_for_bit(dtype, shape):
    """One fused call (fewer kernels) must not move a bit on the CPU: the float32 parity
    with the references rests on it."""
    from omni_qwen3_tts.layers import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(shape[-1], eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    x = (torch.randn(*shape) * 3).to(dtype)
    x32 = x.float()
    spelled_out = norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(
        dtype
    )
    assert torch.equal(norm(x), spelled_out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotating_queries_and_keys_together_changes_no_bit(dtype):
    from omni_qwen3_tts.layers import apply_rope, rope_both

    torch.manual_seed(0)
    q = torch.randn(3, 5, 16, 8, dtype=dtype).transpose(1, 2)  # [B, heads, T, D], a view
    k = torch.randn(3, 5, 2, 8, dtype=dtype).transpose(1, 2)
    positions = torch.arange(5)[None].expand(3, 5) + torch.tensor([[0], [7], [30]])
    cos, sin = rope_cos_sin(positions, 1.0 / (10000 ** (torch.arange(0, 8, 2) / 8)), dtype)
    q_both, k_both = rope_both(q, k, cos, sin)
    assert torch.equal(q_both, apply_rope(q, cos, sin))
    assert torch.equal(k_both, apply_rope(k, cos, sin))


@pytest.mark.parametrize(
    "dtype, marking, quantization",
    [(torch.float32, "unbacked", "none"), (torch.bfloat16, "unbacked", "none"),
     (torch.bfloat16, "dynamic", "none"), (torch.bfloat16, "unbacked", "w8a8_int8")],
)  # fmt: skip
def test_a_compiled_static_step_traces_one_decoder_layer_for_the_whole_stack(
    dtype, marking, quantization
):
    """``engine.enable_torch_compile``: the stack's layers, their q/k/v and gate/up fused as
    the engine packs them, call one traced layer (omni_core.engine.layer_regions), the
    batch an unbacked size (``mark_rows_unbacked``: batches of 1 and 3 trace one graph,
    with graph breaks as errors, as the engine's first compile) or, its fallback, a
    dynamic one (``mark_rows_dynamic``: 2 and 3), and the step computes what the eager
    static step does. ``w8a8_int8``: each layer's int8 products, its fused q/k/v and
    gate/up too, named by their numbers (``omni::w8a8_product``), never layer 0's."""
    from omni_core.engine.compiled import mark_rows_dynamic, mark_rows_unbacked
    from omni_core.engine.cpu_linear import pack_linear_weights
    from omni_core.engine.static_kv import StaticSlotStore, static_mask

    stack = _decoder_stack(
        hidden_size=256, intermediate_size=512, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, head_dim=64,
    ).to(dtype)  # fmt: skip
    with torch.no_grad():
        for param in stack.parameters():
            param.normal_(0, 0.05)
    if dtype == torch.bfloat16:  # float32 packs to oneDNN, which a compiled step turns dense
        pack_linear_weights(stack, min_elements=1)
        assert "_omni_fusion" in stack.layers[0].self_attn.q_proj.__dict__  # q/k/v fused
    if quantization != "none":
        from omni_core.engine.quantize import apply_quantization

        assert apply_quantization(stack, quantization, stage="tts_engine") == 4 * 3
        assert "_omni_fusion" in stack.layers[2].self_attn.q_proj.__dict__  # one product
    graphs: list[torch.fx.GraphModule] = []

    def record(graph, example):
        graphs.append(graph)
        return graph.forward

    def step(caches):
        def run(x, positions, slots):
            store = StaticSlotStore(*caches, slots, positions, 16, regions=True)
            return stack(x, positions, static_mask(positions, 16), store)

        return run

    caches = [torch.zeros(3, 3, 4, 16, 64, dtype=dtype) for _ in range(4)]
    batches = [
        (
            torch.randn(rows, 1, 256).to(dtype),
            torch.tensor([[2], [6], [4]][:rows]),
            torch.arange(rows),
        )
        for rows in ((1, 3) if marking == "unbacked" else (2, 3))
    ]

    def marked(x, positions, slots):
        if marking == "unbacked":
            x, positions, _, slots = mark_rows_unbacked(x, positions, positions, slots, 4)
        else:
            x, positions, _, slots = mark_rows_dynamic(x, positions, positions, slots)
        return x, positions, slots

    from torch._dynamo.utils import compilation_time_metrics as metrics

    torch._dynamo.reset()  # and its counts
    with torch.inference_mode():
        # eager first, as the engine's warm-up
        want = [step(caches[2:])(*batch) for batch in batches]
        compiled = torch.compile(step(caches[:2]), backend=record, fullgraph=True)
        got = [compiled(*marked(*batch)) for batch in batches]
    assert len(graphs) == 1  # both batches
    invoke = torch.ops.higher_order.invoke_subgraph
    bodies = [n.args[0].target for n in graphs[0].graph.nodes if n.target is invoke]
    assert len(bodies) == 3 and len(set(bodies)) == 1
    # traced once, the other layers reused untraced: nothing per layer (the fused projections'
    # member ids, say) may become a constant the body is checked against
    assert len(metrics.get("invoke_subgraph_trace", ())) == 1
    for one, other in zip(got, want, strict=True):
        torch.testing.assert_close(one, other, rtol=0, atol=0)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
@pytest.mark.parametrize(
    "device",
    [
        # slow on the CPU (an inductor build); make test traces the dynamic batch in
        # test_a_compiled_static_step_traces_one_decoder_layer_for_the_whole_stack
        pytest.param("cpu", marks=pytest.mark.slow),
        pytest.param("cuda", marks=pytest.mark.cuda),
    ],
)
def test_compiled_buckets_share_one_graph_of_shared_layers(device):
    """``engine.enable_torch_compile``: the batch is an unbacked size, so buckets 1, 2 and
    4 share one graph, each layer a region traced once (omni_core.engine.compiled's
    mark_rows_unbacked); every bucket computes what the uncompiled static step does,
    served by that graph. On CUDA (the GPU check) the compiled step is also captured,
    a graph per bucket."""
    import os

    from torch._dynamo.utils import counters

    from omni_core.engine.buckets import StaticPlan
    from omni_core.engine.compiled import StaticContext, runs_compiled
    from omni_core.engine.interface import CacheLayout
    from omni_core.engine.kv_cache import SlotKVCache

    if device == "cuda":
        device = os.environ.get("OMNI_CUDA_DEVICE", "cuda")
    where_to = torch.device(device)
    stack = _decoder_stack(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    ).to(where_to)  # fmt: skip
    layout = CacheLayout(2, 2, 16, torch.float32, where_to)
    cache = SlotKVCache(layout, 4, 16, spare=True)
    captured = where_to.type == "cuda"
    context = StaticContext(StaticPlan(True, captured, (1, 2, 4), "test"), cache)
    decoder = context.decoder("stack", stack, hidden=64, dtype=torch.float32)
    assert decoder.regions and decoder.use_graphs == captured
    cache.k.normal_()
    cache.v.normal_()
    graphs = counters["stats"]["unique_graphs"]
    context.warm_up()
    assert counters["stats"]["unique_graphs"] - graphs == 1, decoder.note
    assert len(decoder._graphs) == (3 if captured else 0)  # a capture a bucket (one span)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if captured else {}
    with torch.inference_mode():
        for batch in (1, 2, 3, 4):
            x = torch.randn(batch, 1, 64, device=where_to)
            where = torch.arange(batch, device=where_to)[:, None] * 2 + 5
            slots = torch.arange(batch, device=where_to)
            keys, values = cache.k.clone(), cache.v.clone()
            out = decoder(x, where, where, slots, longest=int(where.max()) + 1)
            cache.k.copy_(keys)
            cache.v.copy_(values)
            want = decoder._eager_step(x, where, where, slots)
            torch.testing.assert_close(out, want, **tolerance)
            # served by the graph: one tensor as positions and cache positions, as the
            # talker passes them, must not miss its guards (then it would run eagerly)
            step = functools.partial(decoder, x, where, where, slots, longest=int(where.max()) + 1)
            assert runs_compiled(step), batch
            cache.k.copy_(keys)
            cache.v.copy_(values)
    assert counters["stats"]["unique_graphs"] - graphs == 1


def _decoder_stack(**sizes: int):
    """A seeded ``DecoderStack`` of ``sizes`` (``TransformerConfig`` fields), in eval mode."""
    from omni_qwen3_tts.config import TransformerConfig
    from omni_qwen3_tts.layers import DecoderStack

    torch.manual_seed(0)
    return DecoderStack(TransformerConfig(vocab_size=32, **sizes)).eval()
