"""Static-shape decode steps: buckets, padding, the static KV store, compile and CUDA graphs.

The toy decoder (``omni_core.engine.toy_model``) is the model here; the
families' own static steps are tested in their plugins. One test compiles
through inductor (one bucket of a one-layer model, to keep it short); the
rest run the same static-shape step without compiling, which is what the
compiled graph computes.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import anyio
import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.backends import EngineSettingsError, validate_engine_settings  # noqa: E402
from omni_core.engine.buckets import (  # noqa: E402
    StaticPlan,
    batch_buckets,
    bucket_for,
    static_plan,
)
from omni_core.engine.compiled import StaticContext  # noqa: E402
from omni_core.engine.interface import EngineSettings, SamplingParams, Sequence  # noqa: E402
from omni_core.engine.kv_cache import SlotKVCache  # noqa: E402
from omni_core.engine.static_kv import StaticSlotStore, static_mask  # noqa: E402
from omni_core.engine.torch_engine import TorchEngine  # noqa: E402
from omni_core.engine.toy_model import TinyDecoder  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]]


def test_buckets_are_powers_of_two_up_to_the_largest():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(8) == (1, 2, 4, 8)
    assert batch_buckets(6) == (1, 2, 4, 6)  # the largest is a bucket even off the powers
    assert [bucket_for(n, (1, 2, 4, 8)) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]
    with pytest.raises(ValueError, match=">= 1"):
        batch_buckets(0)


def test_the_plan_follows_the_settings_and_the_device():
    eager = static_plan(EngineSettings(), "cpu")
    assert not eager.enabled and "enable_torch_compile is off" in eager.reason
    compiled = static_plan(EngineSettings(enable_torch_compile=True, cuda_graph_max_bs=4), "cpu")
    assert (compiled.compile, compiled.cuda_graphs, compiled.buckets) == (True, False, (1, 2, 4))
    graphs = static_plan(EngineSettings(max_running_requests=16), "cuda")
    assert (graphs.compile, graphs.cuda_graphs) == (False, True)  # on by default on CUDA
    assert graphs.buckets == (1, 2, 4, 8, 16)  # default: max_running_requests
    off = static_plan(EngineSettings(disable_cuda_graph=True), "cuda")
    assert not off.enabled and "disable_cuda_graph" in off.reason
    capped = static_plan(
        EngineSettings(enable_torch_compile=True, max_running_requests=4, cuda_graph_max_bs=64),
        "cpu",
    )
    assert capped.buckets == (1, 2, 4)  # a batch above max_running_requests never forms


def test_the_torch_backend_takes_sglangs_names_for_these_keys():
    settings = validate_engine_settings(
        "tts_engine",
        {"enable_torch_compile": True, "cuda_graph_max_bs": 4, "disable_cuda_graph": True},
    )
    assert (settings.enable_torch_compile, settings.cuda_graph_max_bs) == (True, 4)
    assert settings.disable_cuda_graph is True
    with pytest.raises(EngineSettingsError, match="cuda_graph_max_bs"):
        validate_engine_settings("tts_engine", {"cuda_graph_max_bs": 0})


def test_the_static_store_attends_like_the_eager_read():
    """Writes land at each row's position; attention over the masked full slot is the same."""
    from omni_core.engine.interface import CacheLayout

    torch.manual_seed(0)
    layout = CacheLayout(1, 2, 4, torch.float32, torch.device("cpu"))
    cache = SlotKVCache(layout, 3, 10, spare=True)
    assert cache.k.shape[1] == 4 and cache.spare_slot == 3 and len(cache.free) == 3
    cache.k.normal_()
    cache.v.normal_()
    slots, starts = [2, 0], [5, 2]
    k, v = torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4)
    q = torch.randn(2, 2, 1, 4)
    eager = cache.k.clone(), cache.v.clone()
    positions = torch.tensor(starts)[:, None]
    store = StaticSlotStore(cache.k, cache.v, torch.tensor(slots), positions)
    k_all, v_all = store.update(0, k, v)
    assert k_all.shape == (2, 2, 10, 4)  # each row's whole slot
    static_out = torch.nn.functional.scaled_dot_product_attention(
        q, k_all, v_all, attn_mask=static_mask(positions, 10)
    )
    reference = SlotKVCache(layout, 3, 10)
    reference.k.copy_(eager[0][:, :3])
    reference.v.copy_(eager[1][:, :3])
    reference.write(0, slots, starts, k, v)
    assert torch.equal(reference.k, cache.k[:, :3]) and torch.equal(reference.v, cache.v[:, :3])
    for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
        keys, values = reference.read(0, [slot], start + 1)
        want = torch.nn.functional.scaled_dot_product_attention(q[row : row + 1], keys, values)
        torch.testing.assert_close(static_out[row : row + 1], want)


def _manual(model: TinyDecoder, buckets: tuple[int, ...], num_slots: int):
    """A cache with a spare slot and the model's static step, not compiled (same computation)."""
    cache = SlotKVCache(model.cache_layout(), num_slots, 32, spare=True)
    context = StaticContext(StaticPlan(False, False, buckets, "test"), cache)
    model.prepare_static(context)
    context.warm_up()
    return cache


def _drive(model: TinyDecoder, cache: SlotKVCache, prompts: list[list[int]], steps: int):
    """Prefill every prompt, then decode them together: each one's token ids."""
    seqs = []
    for i, prompt in enumerate(prompts):
        seq = Sequence(str(i), prompt, SamplingParams(temperature=0))
        seq.slot = cache.allocate()
        seqs.append(seq)
    model.prefill(seqs, cache)
    for _ in range(steps):
        model.decode(seqs, cache)
    return [seq.state["generated"] for seq in seqs]


def test_padded_static_steps_equal_eager_and_spare_the_other_slots():
    model = TinyDecoder(vocab_size=64, dim=32, num_heads=2, num_layers=2, seed=3)
    eager = _drive(model, SlotKVCache(model.cache_layout(), 4, 32), PROMPTS[:3], 12)
    cache = _manual(model, (1, 4), 4)
    bystander = cache.allocate()  # a slot the batch does not use must not change
    cache.k[:, bystander].fill_(7.0)
    static = _drive(model, cache, PROMPTS[:3], 12)  # 3 rows run in the 4-bucket
    assert static == eager
    assert model.static.calls == 12
    assert torch.all(cache.k[:, bystander] == 7.0)


def test_attention_spans_halve_the_capacity_down_to_the_smallest():
    from omni_core.engine.compiled import attention_spans

    assert attention_spans(512, many=False) == (128, 256, 512)
    assert attention_spans(4096, many=False) == (512, 1024, 2048, 4096)  # four at most
    assert attention_spans(200, many=False) == (200,)  # 100 would be below 128
    # cheap spans (captured, or compiled with the span dynamic): down to the smallest, nine
    # at most (32768 = 128 * 2**8)
    assert attention_spans(32768, many=True) == tuple(128 * 2**i for i in range(9))
    assert attention_spans(2**20, many=True)[0] == 2**12


def test_the_caller_names_its_longest_row_so_no_span_waits_for_the_device(monkeypatch):
    """``longest`` picks the span; without it a step on a device (or captured) takes the whole
    capacity rather than read positions there (meta tensors raise on any read)."""
    from omni_core.engine import compiled

    monkeypatch.setattr(compiled, "SMALLEST_SPAN", 8)
    model = TinyDecoder(vocab_size=64, dim=32, num_heads=2, num_layers=2, seed=7)
    _manual(model, (1, 2), 2)
    static = model.static
    assert static.spans == (8, 16, 32)
    unread = torch.empty(2, 1, dtype=torch.long, device="meta")
    assert [static.span_for(unread, n) for n in (1, 8, 9, 17, 32, 40)] == [8, 8, 16, 32, 32, 32]
    assert static.span_for(unread) == 32
    assert static.span_for(torch.tensor([[3], [11]])) == 16  # on the CPU it reads them
    static.use_graphs = True
    assert static.span_for(torch.tensor([[3], [11]])) == 32


def test_static_steps_read_the_shortest_span_that_holds_their_rows(monkeypatch):
    """Rows growing past each span move to the next; the tokens stay eager's."""
    from omni_core.engine import compiled

    monkeypatch.setattr(compiled, "SMALLEST_SPAN", 8)
    model = TinyDecoder(vocab_size=64, dim=32, num_heads=2, num_layers=2, seed=7)
    eager = _drive(model, SlotKVCache(model.cache_layout(), 2, 32), PROMPTS[:2], 20)
    cache = _manual(model, (1, 2), 2)
    static = model.static
    assert static.spans == (8, 16, 32)
    spans: list[int] = []
    step = static._step

    def recording(*inputs: Any) -> Any:
        spans.append(inputs[-1])
        return step(*inputs)

    static._step = recording
    assert _drive(model, cache, PROMPTS[:2], 20) == eager  # prompts of 3 and 5, 20 new tokens
    assert static.calls == 20
    # the longer row's new token sits at positions 5..24: spans 8 (3 steps), 16, then 32
    assert spans == [8] * 3 + [16] * 8 + [32] * 9


def test_a_batch_above_the_largest_bucket_runs_eagerly():
    model = TinyDecoder(num_layers=1, seed=4)
    eager = _drive(model, SlotKVCache(model.cache_layout(), 4, 32), PROMPTS, 5)
    cache = _manual(model, (1, 2), 4)
    assert _drive(model, cache, PROMPTS, 5) == eager
    assert model.static.calls == 0  # 4 rows: no bucket holds them


def test_a_step_on_another_cache_is_eager():
    """``generate``-style callers bring their own cache: the static step is not theirs."""
    model = TinyDecoder(num_layers=1, seed=5)
    _manual(model, (1, 2), 2)
    other = SlotKVCache(model.cache_layout(), 2, 32)
    _drive(model, other, PROMPTS[:2], 3)
    assert model.static.calls == 0


async def _engine_tokens(model: TinyDecoder, settings: EngineSettings) -> tuple[list, Any]:
    engine = TorchEngine(model, settings)
    out: dict[int, list[int]] = {}
    async with engine:

        async def one(i: int) -> None:
            sampling = SamplingParams(temperature=0, max_new_tokens=8)
            out[i] = [t async for t in engine.enqueue(str(i), PROMPTS[i], sampling)]

        async with anyio.create_task_group() as group:
            for i in range(2):
                group.start_soon(one, i)
    return [out[i] for i in range(2)], engine


@pytest.mark.anyio
async def test_the_engine_compiles_through_inductor_and_equals_eager(capsys):
    """One bucket, one layer: the compiled decode step gives eager's tokens."""
    eager_model = TinyDecoder(num_layers=1, seed=6)
    compiled_model = TinyDecoder(num_layers=1, seed=6)
    base = dict(max_running_requests=2, max_total_tokens=64)
    eager, engine = await _engine_tokens(eager_model, EngineSettings(**base))
    assert engine.warm_up_seconds is None and engine.cache.spare_slot is None
    settings = EngineSettings(enable_torch_compile=True, cuda_graph_max_bs=2, **base)
    compiled, engine = await _engine_tokens(compiled_model, settings)
    assert compiled == eager
    assert engine.cache.spare_slot == 2 and engine.warm_up_seconds is not None
    assert compiled_model.static.calls > 0
    logged = capsys.readouterr().out
    assert "torch.compile for batch sizes 1, 2" in logged
    assert "compiling toy decoder before the stage says ready" in logged
    # buckets 1 and 2, a graph each (dynamo specialises a batch of 1)
    assert re.search(r"toy decoder ready in \d+\.\d s \(2 compiled graphs\)", logged), logged


@pytest.mark.slow  # a second inductor build of the toy engine (~12 s here): make test-all
@pytest.mark.anyio
async def test_a_compiled_engine_keeps_blocked_bf16_layers_and_equals_eager(monkeypatch):
    """Blocked bf16 layers stay blocked through compiling (``omni::blocked_linear``) and
    its attention takes the grouped form (``omni::grouped_attention``): the compiled
    engine's tokens are the eager engine's."""
    from omni_core.engine import cpu_attention, cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice

    if not cpu_linear.blocking_available():
        pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
    routes = KernelChoice(0, False, 0, bf16_blocked=True, bf16_blocked_min_rows=4)
    monkeypatch.setattr(cpu_linear, "_routes", cpu_linear.routes())  # restored after
    monkeypatch.setattr(cpu_linear, "kernel_choice", lambda onednn=True: routes)

    def blocked_model() -> TinyDecoder:
        model = TinyDecoder(vocab_size=64, dim=256, num_layers=1, seed=6, dtype=torch.bfloat16)
        cpu_linear.pack_linear_weights(model)
        return model

    eager_model, compiled_model = blocked_model(), blocked_model()
    assert isinstance(compiled_model.blocks[0].qkv, cpu_linear.BlockedLinear)
    assert cpu_linear.routes().bf16_blocked_min_rows == 4  # padded products too
    # attention: the grouped form in the compiled step, over its static span (eagerly,
    # these short prompts stay under GROUPED_MIN_KEYS: the fused kernel)
    monkeypatch.delenv("OMNI_CPU_ATTENTION", raising=False)
    monkeypatch.setattr(cpu_attention, "_mode", None)
    grouped = []
    counted = cpu_attention.grouped_single_query
    monkeypatch.setattr(
        cpu_attention, "grouped_single_query", lambda *a: grouped.append(1) or counted(*a)
    )
    base = dict(max_running_requests=2, max_total_tokens=64)
    eager, _ = await _engine_tokens(eager_model, EngineSettings(**base))
    grouped.clear()
    settings = EngineSettings(enable_torch_compile=True, cuda_graph_max_bs=2, **base)
    compiled, engine = await _engine_tokens(compiled_model, settings)
    assert grouped  # through omni::grouped_attention
    assert isinstance(compiled_model.blocks[0].qkv, cpu_linear.BlockedLinear)  # kept
    assert compiled == eager and compiled_model.static.calls > 0
    assert engine.warm_up_seconds is not None


def test_a_model_without_a_static_step_decodes_eagerly(caplog):
    class Plain(TinyDecoder):
        prepare_static = None  # type: ignore[assignment]

    engine = TorchEngine(Plain(num_layers=1), EngineSettings(enable_torch_compile=True))
    assert engine.warm_up_seconds is None and engine.cache.spare_slot is None
    assert "decodes eagerly" in caplog.text


@pytest.mark.cuda
def test_cuda_graph_capture_replays_the_step():
    from omni_core.engine.cuda_graphs import CapturedStep

    def step(x, y):
        return torch.relu(x @ y) + 1

    x, y = torch.randn(4, 8, device="cuda"), torch.randn(8, 3, device="cuda")
    captured = CapturedStep(step, [x, y])
    x2 = torch.randn(4, 8, device="cuda")
    torch.testing.assert_close(captured(x2, y), step(x2, y))


@pytest.mark.cuda
def test_a_capture_on_the_last_gpu_from_a_fresh_thread_replays_new_inputs():
    """A fresh thread's current device is cuda:0; a step on cuda:N captured there
    launched outside the capture (an empty graph), and replays returned stale output.
    With one GPU the last is cuda:0, and this still checks a thread that set nothing."""
    import threading

    from omni_core.engine.cuda_graphs import CapturedStep, graph_pool

    device = torch.device("cuda", torch.cuda.device_count() - 1)
    x, y = torch.randn(4, 8, device=device), torch.randn(8, 3, device=device)
    x2 = torch.randn(4, 8, device=device)
    out: dict = {}

    def capture_and_replay() -> None:
        captured = CapturedStep(lambda a, b: a @ b, [x, y], pool=graph_pool(device))
        out["replayed"] = captured(x2, y).clone()

    worker = threading.Thread(target=capture_and_replay)
    worker.start()
    worker.join()
    torch.testing.assert_close(out["replayed"], x2 @ y)


@pytest.mark.cuda
@pytest.mark.anyio
async def test_cuda_graphs_decode_the_toy_model_like_eager():
    base = dict(max_running_requests=2, max_total_tokens=64)
    eager_model = TinyDecoder(num_layers=2, seed=7, device="cuda")
    graph_model = TinyDecoder(num_layers=2, seed=7, device="cuda")
    eager, _ = await _engine_tokens(eager_model, EngineSettings(disable_cuda_graph=True, **base))
    graphed, engine = await _engine_tokens(graph_model, EngineSettings(**base))
    assert engine.static.cuda_graphs and graph_model.static.use_graphs
    assert graphed == eager and graph_model.static.calls > 0


@pytest.mark.cuda
@pytest.mark.anyio
async def test_cuda_graphs_of_each_span_decode_like_eager_as_rows_grow(monkeypatch):
    from omni_core.engine import compiled

    monkeypatch.setattr(compiled, "SMALLEST_SPAN", 8)
    base = dict(max_running_requests=2, max_total_tokens=64)
    eager_model = TinyDecoder(num_layers=2, seed=7, device="cuda")
    graph_model = TinyDecoder(num_layers=2, seed=7, device="cuda")
    eager, _ = await _engine_tokens(eager_model, EngineSettings(disable_cuda_graph=True, **base))
    graphed, _ = await _engine_tokens(graph_model, EngineSettings(**base))
    static = graph_model.static
    assert static.use_graphs and static.spans == (8, 16, 32)
    assert sorted(static._graphs) == [(b, 1, s) for b in (1, 2) for s in (8, 16, 32)]
    assert graphed == eager and static.calls > 0


@pytest.mark.cuda
@pytest.mark.anyio
async def test_compiled_steps_captured_per_span_decode_like_eager_as_rows_grow(monkeypatch):
    """Compiled and captured: one capture per bucket and span (a compiled step once read
    the whole slot on CUDA), eager's tokens."""
    from omni_core.engine import compiled

    monkeypatch.setattr(compiled, "SMALLEST_SPAN", 8)
    base = dict(max_running_requests=2, max_total_tokens=64)
    eager_model = TinyDecoder(num_layers=2, seed=7, device="cuda")
    graph_model = TinyDecoder(num_layers=2, seed=7, device="cuda")
    eager, _ = await _engine_tokens(eager_model, EngineSettings(disable_cuda_graph=True, **base))
    settings = EngineSettings(enable_torch_compile=True, **base)
    graphed, engine = await _engine_tokens(graph_model, settings)
    static = graph_model.static
    assert engine.static.compile and static.use_graphs and static.dynamic_span
    assert static.spans == (8, 16, 32)
    assert sorted(static._graphs) == [(b, 1, s) for b in (1, 2) for s in (8, 16, 32)]
    assert graphed == eager and static.calls > 0


@pytest.mark.anyio
async def test_the_engine_runs_an_uncompiled_static_plan_when_given_one():
    model = TinyDecoder(num_layers=1, seed=8)
    settings = EngineSettings(max_running_requests=2, max_total_tokens=64)
    eager, _ = await _engine_tokens(TinyDecoder(num_layers=1, seed=8), settings)
    engine_tokens, engine = await _engine_tokens_with(model, settings, (1, 2))
    assert engine_tokens == eager and model.static.calls > 0
    assert not engine.static.compile and engine.cache.spare_slot == 2


async def _engine_tokens_with(model, settings, buckets):
    engine = TorchEngine(model, settings, static=StaticPlan(False, False, buckets, "test"))
    out: dict[int, list[int]] = {}
    async with engine:

        async def one(i: int) -> None:
            sampling = SamplingParams(temperature=0, max_new_tokens=8)
            out[i] = [t async for t in engine.enqueue(str(i), PROMPTS[i], sampling)]

        async with anyio.create_task_group() as group:
            for i in range(2):
                group.start_soon(one, i)
    return [out[i] for i in range(2)], engine


def test_packed_linears_are_made_dense_again_for_inductor():
    from omni_core.engine.compiled import dense_linears
    from omni_core.engine.cpu_linear import PackedLinear, pack_linear_weights

    model = TinyDecoder(num_layers=2, seed=9)
    x = torch.randn(3, 1, model.dim)
    with torch.no_grad():
        want = model.blocks[0].qkv(x)
    packed = pack_linear_weights(model, min_elements=0)
    if not packed:
        pytest.skip("this torch build cannot pack linear layers")
    assert dense_linears(model) == packed
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model.blocks[0].qkv(x), want)


def test_a_decoder_that_cannot_be_captured_decodes_eagerly_under_cuda_graphs():
    """Static shapes were only for the capture: a step that reads the host keeps its eager path."""
    model = TinyDecoder(num_layers=1, seed=10)
    cache = SlotKVCache(model.cache_layout(), 2, 32, spare=True)
    context = StaticContext(StaticPlan(False, True, (1, 2), "test"), cache)
    model.prepare_static(context)
    context.warm_up()
    assert not model.static.use_graphs and not model.static.enabled
    eager = _drive(model, SlotKVCache(model.cache_layout(), 2, 32), PROMPTS[:2], 4)
    assert _drive(model, cache, PROMPTS[:2], 4) == eager and model.static.calls == 0


def test_warm_up_runs_on_the_compute_thread_with_raised_recompile_limits():
    """Dynamo guards on the thread count and keeps its limits per thread: warm where steps run."""
    import threading

    from omni_core.engine.compiled import RECOMPILE_LIMIT
    from omni_core.engine.compute import compute_thread

    model = TinyDecoder(num_layers=1, seed=9)
    cache = SlotKVCache(model.cache_layout(), 2, 16, spare=True)
    context = StaticContext(StaticPlan(True, False, (1,), "test"), cache)
    seen: list[threading.Thread] = []
    decoder = context.decoder("toy", model.stack, hidden=model.dim, dtype=torch.float32)
    decoder._step = lambda *inputs: seen.append(threading.current_thread())  # no inductor here
    decoder._eager_step = decoder._step
    context.warm_up()
    worker = compute_thread().thread
    assert seen and set(seen) == {worker}  # the eager first call and the bucket's
    limits: list[int] = []
    compute_thread().submit(lambda: limits.append(torch._dynamo.config.recompile_limit)).result()
    assert limits == [RECOMPILE_LIMIT]


def test_a_warm_step_never_recompiles_while_serving():
    """An expanded (stride-0) input fills a bucket like a contiguous one; an unforeseen
    shape after warm-up runs eagerly instead of compiling in the middle of serving."""
    from torch._dynamo.utils import counters

    model = TinyDecoder(num_layers=1, seed=4)
    cache = SlotKVCache(model.cache_layout(), 2, 16, spare=True)
    context = StaticContext(StaticPlan(True, False, (2,), "test"), cache)
    decoder = context.decoder("toy", model.stack, hidden=model.dim, dtype=torch.float32)
    context.warm_up()
    assert decoder.warm
    graphs = counters["stats"]["unique_graphs"]
    x = torch.randn(2, 1, model.dim)
    where = torch.zeros(1, 1, dtype=torch.long).expand(2, 1)  # stride 0, as a caller's view
    # the graphs guard on strides: a full bucket passes its inputs on made contiguous
    assert all(t.is_contiguous() for t in decoder._padded(2, x, where, where, torch.arange(2)))
    with torch.inference_mode():
        out = decoder(x, where, where, torch.arange(2))
        eager = decoder._eager_step(x, where.contiguous(), where.contiguous(), torch.arange(2))
        torch.testing.assert_close(out, eager)
        decoder.k_cache = decoder.k_cache.clone()  # a tensor no graph was compiled for
        decoder.v_cache = decoder.v_cache.clone()
        torch.testing.assert_close(decoder(x, where, where, torch.arange(2)), eager)
    assert counters["stats"]["unique_graphs"] == graphs  # no compile after warm-up


@pytest.mark.parametrize("regions", ["1", pytest.param("0", marks=pytest.mark.slow)])
def test_a_compiled_step_serves_every_span_with_one_graph_a_bucket(monkeypatch, regions):
    """The span is a dynamic size: a bucket compiles one graph for every span, the whole
    slot's too (read as a slice, its layout differs, and inductor guarded on it), each
    layer built once or not; every span's step equals the uncompiled static step's."""
    from torch._dynamo.utils import counters

    from omni_core.engine import compiled
    from omni_core.engine.compiled import attention_spans

    monkeypatch.setattr(compiled, "SMALLEST_SPAN", 8)
    monkeypatch.setenv("OMNI_COMPILE_REGIONS", regions)
    model = TinyDecoder(num_layers=2, seed=11)
    cache = SlotKVCache(model.cache_layout(), 2, 64, spare=True)
    context = StaticContext(StaticPlan(True, False, (2,), "test"), cache)
    decoder = context.decoder("toy", model.stack, hidden=model.dim, dtype=torch.float32)
    assert decoder.dynamic_span
    assert decoder.spans == attention_spans(64, many=True) == (8, 16, 32, 64)
    cache.k.normal_()
    cache.v.normal_()
    graphs = counters["stats"]["unique_graphs"]
    context.warm_up()
    assert counters["stats"]["unique_graphs"] - graphs == 1  # the bucket's, for every span
    torch.manual_seed(0)
    with torch.inference_mode():  # as the engine steps (a graph guards on it)
        x = torch.randn(2, 1, model.dim)
        slots = torch.tensor([0, 1])
        for span in decoder.spans:
            where = torch.tensor([[span - 1], [span // 2]])
            keys, values = cache.k.clone(), cache.v.clone()
            out = decoder._step(x, where, where, slots, span)
            cache.k.copy_(keys)  # the same cache for the uncompiled step
            cache.v.copy_(values)
            torch.testing.assert_close(out, decoder._eager_step(x, where, where, slots, span))
    assert counters["stats"]["unique_graphs"] - graphs == 1  # no span compiled again


def _warmed_toy(model: TinyDecoder, regions: str, monkeypatch, forward=None):
    """``model``'s compiled step (``forward``, default its stack) over buckets 1, 2 and 4,
    warmed up: the decoder, its cache, and how many graphs the warm-up built. With two
    layers the second runs the first's traced region, where a biased linear over 3-D
    rows had made the batch static (toy_model._rows)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("OMNI_COMPILE_REGIONS", regions)
    cache = SlotKVCache(model.cache_layout(), 4, 16, spare=True)
    context = StaticContext(StaticPlan(True, False, (1, 2, 4), "test"), cache)
    decoder = context.decoder("toy", forward or model.stack, hidden=model.dim, dtype=torch.float32)
    assert len(decoder.spans) == 1
    cache.k.normal_()
    cache.v.normal_()
    graphs = counters["stats"]["unique_graphs"]
    context.warm_up()
    return decoder, cache, counters["stats"]["unique_graphs"] - graphs


def _served_like_eager(decoder, model, cache) -> int:
    """Batches 1 to 4 through the warmed step, each equal to the uncompiled step's and run
    by a compiled graph (one tensor as positions and cache positions, as models pass
    them); how many graphs serving them built (none: warm-up compiled every bucket)."""
    from torch._dynamo.utils import counters

    from omni_core.engine.compiled import runs_compiled

    graphs = counters["stats"]["unique_graphs"]
    torch.manual_seed(0)
    with torch.inference_mode():
        for batch in (1, 2, 3, 4):
            x = torch.randn(batch, 1, model.dim)
            where = torch.arange(batch)[:, None] * 3 + 2
            slots = torch.arange(batch)
            keys, values = cache.k.clone(), cache.v.clone()
            out = decoder(x, where, where, slots)
            cache.k.copy_(keys)  # the same cache for the uncompiled step
            cache.v.copy_(values)
            torch.testing.assert_close(out, decoder._eager_step(x, where, where, slots))
            assert runs_compiled(functools.partial(decoder, x, where, where, slots)), batch
            cache.k.copy_(keys)
            cache.v.copy_(values)
    return counters["stats"]["unique_graphs"] - graphs


@pytest.mark.slow  # an inductor build; make test traces an unbacked batch in omni_qwen3_tts's
@pytest.mark.parametrize("regions", ["1", "0"])
def test_every_bucket_shares_one_compiled_graph(monkeypatch, regions):
    """The batch is an unbacked size (compiled.mark_rows_unbacked): buckets 1, 2 and 4
    share one graph, each layer a region or not; each bucket's step equals the
    uncompiled one's, and serving compiles nothing more."""
    model = TinyDecoder(num_layers=2, seed=12)
    decoder, cache, built = _warmed_toy(model, regions, monkeypatch)
    assert built == 1 and decoder.rows_unbacked and decoder.note == ""
    assert _served_like_eager(decoder, model, cache) == 0


@pytest.mark.slow  # two inductor builds
def test_a_step_that_reads_its_batch_compiles_bucket_one_apart_and_says_why(monkeypatch):
    """A plugin's step that branches on its batch size cannot take it unbacked: the first
    compile meets the branch as an error, and the step falls back to a dynamic batch,
    bucket 1 a graph of its own (dynamo specialises a size of 1), the engine's note
    saying so; the steps still equal the uncompiled ones."""
    model = TinyDecoder(num_layers=2, seed=12)

    def reads_its_batch(x, positions, mask, store):
        out = model.stack(x, positions, mask, store)
        return out.clone() if x.shape[0] > 1 else out  # the same numbers either way

    decoder, cache, built = _warmed_toy(model, "1", monkeypatch, reads_its_batch)
    assert built == 2 and not decoder.rows_unbacked
    assert decoder.note.startswith(
        "toy: bucket 1 compiled apart from the others, as the step reads its batch size ("
    ), decoder.note
    assert "data-dependent" in decoder.unbacked_refusal, decoder.unbacked_refusal
    assert _served_like_eager(decoder, model, cache) == 0


@pytest.mark.slow  # an inductor build
def test_a_served_step_that_misses_every_graph_runs_eagerly_and_says_so_once(monkeypatch, caplog):
    """After warm-up, a step whose inputs fail every graph's guards (positions of another
    integer type than warm-up's) is not compiled in the middle of serving: it runs
    eagerly, equal to the uncompiled step, is counted, and the engine warns once per
    shape, naming the failed guard."""
    model = TinyDecoder(num_layers=2, seed=12)
    decoder, cache, _ = _warmed_toy(model, "1", monkeypatch)
    logs = caplog.at_level(logging.WARNING, logger="omni_core.engine.compiled")
    with logs, torch.inference_mode():
        x = torch.randn(2, 1, model.dim)
        where = (torch.arange(2)[:, None] * 3 + 2).int()
        slots = torch.arange(2)
        for _ in range(2):
            keys, values = cache.k.clone(), cache.v.clone()
            out = decoder(x, where, where, slots)
            cache.k.copy_(keys)
            cache.v.copy_(values)
            torch.testing.assert_close(out, decoder._eager_step(x, where, where, slots))
    assert decoder.misses == 2
    warned = [r.getMessage() for r in caplog.records if "missed every compiled graph" in r.message]
    assert len(warned) == 1, warned
    assert warned[0].startswith(
        "engine: toy: a step of 2 row(s) (bucket 2, 1 position(s) a row) missed every compiled "
        "graph and ran eagerly (said once a shape): - "
    ), warned[0]
    assert "dtype mismatch. expected Long, actual Int" in warned[0], warned[0]


def test_a_failed_capture_says_so_and_falls_back_to_what_the_plan_allows(monkeypatch):
    from omni_core.engine.compiled import attention_spans

    model = TinyDecoder(num_layers=1, seed=4)
    cache = SlotKVCache(model.cache_layout(), 2, 32, spare=True)
    context = StaticContext(StaticPlan(False, True, (1, 2), "test"), cache)
    model.prepare_static(context)
    static = model.static
    static.use_graphs = static.enabled = True  # as on a GPU, where capture is planned

    def refuse() -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(static, "_capture_all", refuse)
    context.warm_up()
    assert "CUDA graph capture failed (RuntimeError: operation not permitted" in static.note
    assert (static.use_graphs, static.enabled, static.warm) == (False, False, False)
    assert static.spans == attention_spans(32, many=False)  # eager spans, not the captured


def test_after_warm_up_runs_once_the_decoders_are_warm_and_its_note_is_kept():
    """A model captures what surrounds its steps (a whole frame) after they are captured."""
    import threading

    from omni_core.engine.compute import compute_thread

    model = TinyDecoder(num_layers=1, seed=9)
    cache = SlotKVCache(model.cache_layout(), 2, 16, spare=True)
    context = StaticContext(StaticPlan(False, False, (1,), "test"), cache)
    decoder = context.decoder("toy", model.stack, hidden=model.dim, dtype=torch.float32)
    order: list[tuple[str, threading.Thread]] = []
    warm_up = decoder.warm_up
    decoder.warm_up = lambda: (warm_up(), order.append(("decoder", threading.current_thread())))

    def capture_more() -> str:
        order.append(("after", threading.current_thread()))
        return "toy: frame captured"

    context.after_warm_up(capture_more)
    context.after_warm_up(lambda: None)  # nothing to say: no note
    context.warm_up()
    worker = compute_thread().thread
    assert order == [("decoder", worker), ("after", worker)]
    assert context.notes == ["toy: frame captured"]
