"""A compiled static step traces and builds one decoder layer and runs it as every layer.

The toy decoder's blocks go through :func:`~omni_core.engine.layer_regions.call_layer`
as the families' stacks do. Graphs are read from dynamo through a recording
backend (what inductor would be handed), so these tests see how many layer
bodies a step holds without timing a compile.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.buckets import StaticPlan  # noqa: E402
from omni_core.engine.compiled import StaticContext  # noqa: E402
from omni_core.engine.kv_cache import SlotKVCache  # noqa: E402
from omni_core.engine.static_kv import LayerSlotStore, StaticSlotStore, static_mask  # noqa: E402
from omni_core.engine.toy_model import Block, TinyDecoder  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")


def _regions(graph: torch.fx.GraphModule) -> list[str]:
    """The subgraph each ``invoke_subgraph`` call of ``graph`` runs, in call order."""
    invoke = torch.ops.higher_order.invoke_subgraph
    return [node.args[0].target for node in graph.graph.nodes if node.target is invoke]


def _static_step(model: TinyDecoder, regions: bool, layers: int, capacity: int = 16):
    """The model's stack over a static store, and the store's cache (slot 0 is padding)."""
    cache = torch.zeros(layers, 3, 2, capacity, model.dim // 2, dtype=model.dtype)
    k, v = cache.clone(), cache.clone()

    def step(x, positions, slots):
        store = StaticSlotStore(k, v, slots, positions, capacity, regions=regions)
        return model.stack(x, positions, static_mask(positions, capacity), store)

    return step, (k, v)


def _inputs(dim: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    x = torch.randn(2, 1, dim).to(dtype)
    return x, torch.tensor([[3], [5]]), torch.tensor([1, 2])


def _compiled_and_eager(step, eager_step, inputs) -> tuple[list[torch.fx.GraphModule], Any, Any]:
    """``step`` compiled through a backend that keeps dynamo's graphs; its output and eager's.

    Eager first, as a static decoder's warm-up runs it: whatever a model fills
    lazily on its first call is then there when dynamo traces. Dynamo is reset
    first, its counts (:func:`_region_counts`) with it.
    """
    graphs: list[torch.fx.GraphModule] = []

    def record(graph: torch.fx.GraphModule, example: Any):
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    with torch.inference_mode():
        want = eager_step(*inputs)
        got = torch.compile(step, backend=record, fullgraph=True, dynamic=False)(*inputs)
    return graphs, got, want


def _region_counts() -> tuple[int, int]:
    """How many region bodies dynamo traced, and how many calls reused one, since its reset."""
    from torch._dynamo.utils import compilation_time_metrics as metrics

    return (
        len(metrics.get("invoke_subgraph_trace", ())),
        len(metrics.get("invoke_subgraph_reuse_stamp_out", ())),
    )


@pytest.mark.parametrize("regions", [True, False])
def test_every_layer_calls_one_traced_region_and_computes_what_eager_does(regions):
    model = TinyDecoder(dim=32, num_heads=2, num_layers=4, seed=5)
    step, compiled_cache = _static_step(model, regions, 4)
    eager_step, eager_cache = _static_step(model, regions, 4)
    graphs, got, want = _compiled_and_eager(step, eager_step, _inputs(32))
    # regions: one body traced, the other three layers reuse it untraced (a fast warm start)
    assert _region_counts() == ((1, 3) if regions else (0, 0))
    assert len(graphs) == 1
    called = _regions(graphs[0])
    if regions:
        assert len(called) == 4 and len(set(called)) == 1  # four layers, one body
    else:
        assert called == []  # each layer inlined into the step's graph
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for ours, theirs in zip(compiled_cache, eager_cache, strict=True):
        assert torch.equal(ours, theirs)  # each layer wrote its own keys, at its own rows
    assert ours[:, 1:].abs().sum(dim=(1, 2, 3, 4)).gt(0).all()  # all four layers wrote


def test_a_layer_store_writes_and_reads_what_the_static_store_does():
    """The region's store names its layer by a tensor; its cache ends up the same."""
    torch.manual_seed(1)
    layers, slots, heads, capacity, dim = 3, 4, 2, 8, 4
    k, v = (
        torch.randn(layers, slots, heads, capacity, dim),
        torch.randn(layers, slots, heads, capacity, dim),
    )
    new_k, new_v = torch.randn(2, heads, 2, dim), torch.randn(2, heads, 2, dim)
    rows, positions = torch.tensor([3, 1]), torch.tensor([[4, 5], [0, 1]])
    whole = StaticSlotStore(k.clone(), v.clone(), rows, positions, 6)
    one = LayerSlotStore(k.clone(), v.clone(), torch.tensor([2]), rows, positions, 6)
    want = whole.update(2, new_k, new_v)
    got = one.update(0, new_k, new_v)  # the number it is handed goes unused
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(one.k, whole.k) and torch.equal(one.v, whole.v)
    assert not torch.equal(one.k, k)  # and it did write


def test_blocked_bf16_layers_share_one_region_through_their_weight_numbers(monkeypatch):
    """A blocked weight is named by a tensor (``handle``), not a constant of the graph, so
    layers holding different weights still run one body, each with its own weights."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_blocked_weight import blocking_available
    from omni_core.engine.cpu_kernel_choice import KernelChoice
    from omni_core.engine.cpu_linear import BlockedLinear, pack_linear_weights

    if not blocking_available():
        pytest.skip("this CPU or torch build has no blocked bf16 products")
    # this machine's routes made the blocked ones, whatever its measurement chose
    monkeypatch.setattr(cpu_linear, "_routes", cpu_linear.routes())
    chosen = KernelChoice(0, False, 0, bf16_blocked=True, source="measured")
    monkeypatch.setattr(cpu_linear, "kernel_choice", lambda onednn=True: chosen)
    model = TinyDecoder(dim=256, num_heads=2, num_layers=3, seed=6, dtype=torch.bfloat16)
    pack_linear_weights(model)
    assert isinstance(model.blocks[0].qkv, BlockedLinear)
    step, _ = _static_step(model, True, 3)
    eager_step, _ = _static_step(model, True, 3)
    graphs, got, want = _compiled_and_eager(step, eager_step, _inputs(256, torch.bfloat16))
    assert _region_counts() == (1, 2)
    called = _regions(graphs[0])
    assert len(called) == 3 and len(set(called)) == 1
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same kernels, in order


def test_a_compiled_step_with_regions_equals_eager_through_inductor():
    model = TinyDecoder(dim=32, num_heads=2, num_layers=3, seed=7)
    cache = SlotKVCache(model.cache_layout(), 2, 16, spare=True)
    context = StaticContext(StaticPlan(True, False, (2,), "test"), cache)
    model.prepare_static(context)
    context.warm_up()
    decoder = model.static
    assert decoder.regions and decoder.warm
    x, positions, slots = _inputs(32)
    with torch.inference_mode():
        got = decoder(x, positions, positions, slots)
        want = decoder._eager_step(x, positions, positions, slots)
    torch.testing.assert_close(got, want)


@pytest.mark.slow  # a second cold inductor build (~9 s here): make test-all
def test_a_layer_that_breaks_the_graph_compiles_in_pieces_and_says_so(monkeypatch, caplog):
    """A region must be traced whole; a layer dynamo cannot take so is compiled as before."""
    finish = Block.finish

    def breaking(self, *args):
        torch._dynamo.graph_break()
        return finish(self, *args)

    monkeypatch.setattr(Block, "finish", breaking)
    torch._dynamo.reset()
    model = TinyDecoder(dim=32, num_heads=2, num_layers=2, seed=8)
    cache = SlotKVCache(model.cache_layout(), 2, 16, spare=True)
    context = StaticContext(StaticPlan(True, False, (2,), "test"), cache)
    model.prepare_static(context)
    with caplog.at_level("WARNING", logger="omni_core.engine.compiled"):
        context.warm_up()
    decoder = model.static
    assert decoder.warm and not decoder.regions
    assert "each layer compiled on its own" in decoder.note
    assert "each layer compiled on its own" in caplog.text
    x, positions, slots = _inputs(32)
    with torch.inference_mode():
        got = decoder(x, positions, positions, slots)
        want = decoder._eager_step(x, positions, positions, slots)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(("value", "wanted"), [("0", False), ("off", False), ("1", True)])
def test_the_environment_switch_turns_regions_off(monkeypatch, value, wanted):
    """``OMNI_COMPILE_REGIONS=0``: each step compiled as one graph (a cache that survives)."""
    monkeypatch.setenv("OMNI_COMPILE_REGIONS", value)
    model = TinyDecoder(dim=32, num_heads=2, num_layers=2, seed=9)
    cache = SlotKVCache(model.cache_layout(), 2, 16, spare=True)
    model.prepare_static(StaticContext(StaticPlan(True, False, (1,), "test"), cache))
    assert model.static.regions is wanted


def test_a_bad_switch_value_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("OMNI_COMPILE_REGIONS", "maybe")
    model = TinyDecoder(dim=32, num_heads=2, num_layers=1, seed=9)
    cache = SlotKVCache(model.cache_layout(), 2, 16, spare=True)
    with pytest.raises(ValueError, match="OMNI_COMPILE_REGIONS='maybe'"):
        model.prepare_static(StaticContext(StaticPlan(True, False, (1,), "test"), cache))
