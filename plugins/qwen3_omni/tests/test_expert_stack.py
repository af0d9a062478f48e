"""Stacked experts: one grouped product per mixture, equal to the per-expert loop, laid out
where loading, weight sharing and the step models expect it (tiny sizes, CPU)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine import mapped  # noqa: E402
from omni_core.engine.quantize import quantize_linear_weights  # noqa: E402
from omni_core.runtime.weight_share import host  # noqa: E402
from omni_qwen3_omni.loading import construct  # noqa: E402
from omni_qwen3_omni.thinker import expert_stack  # noqa: E402
from omni_qwen3_omni.thinker.expert_stack import lies_stacked, stacked_views  # noqa: E402
from omni_qwen3_omni.thinker.moe import (  # noqa: E402
    SparseMoE,
    mixtures_capturable,
    stack_mixtures,
    sum_in_expert_order,
)

torch.set_num_threads(1)

HIDDEN, INNER, EXPERTS, TOP_K = 32, 32, 6, 2  # rows of 32 values: no SIMD tail


def _moe(seed: int = 0, norm: bool = True, dtype: torch.dtype = torch.float32) -> SparseMoE:
    moe = SparseMoE(HIDDEN, INNER, EXPERTS, TOP_K, norm).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            scale = 0.5 if name == "gate.weight" else 0.2
            p.copy_(scale * torch.randn(p.shape, generator=gen))
    return moe.to(dtype)


def _tokens(count: int, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("count", [1, 3, 8, 17])
def test_stacked_equals_the_loop_bit_for_bit_in_float32(norm, count):
    moe = _moe(seed=count, norm=norm)
    x = _tokens(count)
    with torch.no_grad():
        looped = moe._looped(x)
        assert moe.uses_stack() and lies_stacked(moe.experts)
        assert torch.equal(moe(x), looped)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("count", [2, 5, 16])
def test_the_loop_is_the_releases_mixture_bit_for_bit(dtype, count):
    """The loop (one gather, slices per expert, one weighting and ordered sum) against the
    release's form written out: each expert on its tokens, weighted, added to a zero
    start in ascending expert order. Four experts a token: with two, any order of the
    sum rounds alike."""
    moe = SparseMoE(HIDDEN, INNER, EXPERTS, 4).eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(count)))
    moe = moe.to(dtype)
    x = _tokens(count, dtype, seed=count)
    with torch.no_grad():
        weights, experts = moe.route(x)
        want = torch.zeros_like(x)
        for expert in range(EXPERTS):
            token, slot = (experts == expert).nonzero(as_tuple=True)
            if token.numel():
                rows = moe.experts[expert](x[token]) * weights[token, slot][:, None]
                want.index_add_(0, token, rows)
        assert torch.equal(moe._looped(x), want)


def test_stacked_is_close_to_the_loop_in_bfloat16():
    moe = _moe(dtype=torch.bfloat16)
    x = _tokens(9, torch.bfloat16)
    with torch.no_grad():
        looped = moe._looped(x)
        assert moe.uses_stack()
        torch.testing.assert_close(moe(x), looped, rtol=2e-2, atol=2e-2)


def test_outputs_are_summed_in_ascending_expert_order_with_a_rounding_per_add():
    """As the release sums: one bfloat16 rounding after each expert, lowest expert first
    (one ``index_add_`` over every pair would round once on the CPU)."""
    gen = torch.Generator().manual_seed(5)
    tokens, width = 7, HIDDEN
    experts = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(tokens)])
    pairs = experts.reshape(-1)
    order = pairs.argsort(stable=True)
    weighted = (10 * torch.randn(tokens * TOP_K, width, generator=gen)).bfloat16()
    want = torch.zeros(tokens, width, dtype=torch.bfloat16)
    for row, pair in enumerate(order.tolist()):  # rows come in ascending expert order
        want[pair // TOP_K] += weighted[row]
    assert torch.equal(sum_in_expert_order(weighted, order, experts), want)


def test_the_stacked_path_reads_nothing_on_the_host():
    """On the meta device any host read (``.tolist()``, ``.item()``) raises: the loop
    does, the stacked path, routing and offsets included, does not."""
    moe = SparseMoE(HIDDEN, INNER, EXPERTS, TOP_K).to("meta", torch.bfloat16)
    x = torch.empty(5, HIDDEN, device="meta", dtype=torch.bfloat16)
    assert moe.uses_stack()
    assert moe(x).shape == (5, HIDDEN)
    with pytest.raises((RuntimeError, NotImplementedError)):
        moe._looped(x)


def test_construct_lays_out_the_stacks_and_loading_by_name_fills_them():
    built = construct(lambda: SparseMoE(HIDDEN, INNER, EXPERTS, TOP_K), "cpu", torch.float32)
    assert lies_stacked(built.experts)
    source = _moe(seed=4)
    state = {k: v.clone() for k, v in source.state_dict().items()}
    assert set(built.state_dict()) == set(state)  # the release's names, nothing added
    assert "experts.3.up_proj.weight" in state
    built.load_state_dict(state)
    gate_up, down = stacked_views(built.experts)
    assert torch.equal(gate_up[3, INNER:], state["experts.3.up_proj.weight"])
    assert torch.equal(down[5], state["experts.5.down_proj.weight"])
    x = _tokens(4)
    with torch.no_grad():
        assert torch.equal(built(x), source._looped(x))


def test_weights_replaced_after_stacking_are_stacked_again():
    moe = _moe()
    x = _tokens(6)
    with torch.no_grad():
        moe(x)
        assert lies_stacked(moe.experts)
        moe.to(torch.bfloat16)  # converts each weight on its own: the views are gone
        assert not lies_stacked(moe.experts)
        looped = moe._looped(x.bfloat16())
        out = moe(x.bfloat16())
    assert lies_stacked(moe.experts)
    torch.testing.assert_close(out, looped, rtol=2e-2, atol=2e-2)


def test_shared_stacked_weights_are_adopted_in_place():
    """A weight-sharing leader publishes the stacks; its mapped views still lie stacked."""
    leader = construct(lambda: SparseMoE(HIDDEN, INNER, EXPERTS, TOP_K), "cpu", torch.float32)
    leader.load_state_dict(_moe(seed=2).state_dict())
    x = _tokens(5)
    with torch.no_grad():
        want = leader._looped(x)
    manifest, fd, mapping = host.publish(leader)
    try:
        follower = SparseMoE(HIDDEN, INNER, EXPERTS, TOP_K).eval()
        follower_map = host.attach(follower, manifest, os.dup(fd), "test")
        gate = follower.experts[0].gate_proj.weight
        assert mapped.is_mapped(gate) and lies_stacked(follower.experts)
        with torch.no_grad():
            assert follower.uses_stack() and torch.equal(follower(x), want)
        assert follower.experts[0].gate_proj.weight.data_ptr() == gate.data_ptr()  # no copy
        mapped.remove_range(follower_map.address)  # its address may be reused by later tests
    finally:
        os.close(fd)
        mapped.remove_range(mapping.address)


def test_shared_unstacked_weights_are_never_copied():
    """A copy per follower would undo weight sharing: such experts keep the loop."""
    leader = _moe(seed=3)  # never run, so never stacked
    x = _tokens(5)
    with torch.no_grad():
        want = leader._looped(x)
    _, fd, mapping = host.publish(leader)
    try:
        assert not lies_stacked(leader.experts) and not expert_stack.may_copy(leader.experts)
        with torch.no_grad():
            assert not leader.uses_stack() and torch.equal(leader(x), want)
        assert not lies_stacked(leader.experts)
    finally:
        os.close(fd)
        mapped.remove_range(mapping.address)


def test_int8_experts_and_unaligned_widths_keep_the_loop():
    quantized = _moe(dtype=torch.bfloat16)
    x = _tokens(4, torch.bfloat16)
    with torch.no_grad():
        want = quantized(x)
    quantize_linear_weights(quantized)
    assert not quantized.uses_stack()
    with torch.no_grad():
        torch.testing.assert_close(quantized(x), want, rtol=0.1, atol=0.1)
    narrow = SparseMoE(HIDDEN, 12, EXPERTS, TOP_K).to(torch.bfloat16)  # rows of 24 bytes
    assert not narrow.uses_stack() and not lies_stacked(narrow.experts)


def test_graphs_are_planned_only_where_the_grouped_kernel_is_fused(monkeypatch):
    moe = _moe(dtype=torch.bfloat16)
    dense = torch.nn.Sequential(torch.nn.Linear(4, 4))
    cpu = torch.device("cpu")
    assert mixtures_capturable(dense, cpu, torch.bfloat16)  # nothing routes on the host
    assert not mixtures_capturable(moe, cpu, torch.bfloat16)  # torch loops over groups here
    assert lies_stacked(moe.experts)  # stacked on the way, before any trace
    assert not expert_stack.graph_capturable(cpu, torch.bfloat16)
    assert stack_mixtures(dense) == (0, 0) and stack_mixtures(moe) == (1, 1)
    from omni_qwen3_omni.thinker import moe as moe_module

    # as on a Hopper GPU, where the grouped kernel reads its offsets on the device
    monkeypatch.setattr(moe_module, "graph_capturable", lambda device, dtype: True)
    assert mixtures_capturable(moe, cpu, torch.bfloat16)
    quantize_linear_weights(moe)
    assert not mixtures_capturable(moe, cpu, torch.bfloat16)  # int8 experts loop


class _RecordingContext:
    """Stands in for the engine's static context: records what each step asks for."""

    def __init__(self):
        self.graph_safe: dict[str, bool] = {}

    def decoder(self, name, step, **options):
        self.graph_safe[name] = options["graph_safe"]
        return None


@pytest.mark.parametrize("capturable", [False, True])
def test_loaded_parts_lie_stacked_and_the_steps_plan_graphs_from_them(monkeypatch, capturable):
    from omni_qwen3_omni.loading import load_part, read_raw_config
    from omni_qwen3_omni.talker.config import TalkerConfig
    from omni_qwen3_omni.talker.step import TalkerStepModel
    from omni_qwen3_omni.thinker import moe as moe_module
    from omni_qwen3_omni.thinker.step import ThinkerStepModel

    monkeypatch.setattr(moe_module, "graph_capturable", lambda device, dtype: capturable)
    cpu = torch.device("cpu")
    lm, config, root = load_part("tiny", "thinker", "dummy", "float32", "cpu")
    talker = load_part("tiny", "talker_ar", "dummy", "float32", "cpu")[0]
    for part in (lm, talker):
        mixtures = [m for m in part.modules() if isinstance(m, SparseMoE)]
        assert mixtures and all(lies_stacked(m.experts) for m in mixtures)
    context = _RecordingContext()
    thinker = ThinkerStepModel(lm, config.text, eos_ids=set(), device=cpu, dtype=torch.float32)
    thinker.prepare_static(context)
    step = TalkerStepModel(
        talker, TalkerConfig.from_dict(read_raw_config(root)), device=cpu, dtype=torch.float32
    )
    monkeypatch.setattr(talker.code_predictor, "prepare_static", lambda *args: None)
    step.prepare_static(context)
    assert context.graph_safe == {"thinker": capturable, "talker": capturable}


def test_a_stack_first_made_inside_a_step_still_takes_new_weights():
    """Engines step in inference mode; a stack made there must not be an inference tensor,
    which a later ``load_state_dict`` could not write."""
    moe = _moe(seed=6)
    state = {k: v.clone() for k, v in _moe(seed=7).state_dict().items()}
    with torch.inference_mode():
        moe(_tokens(3))
    assert lies_stacked(moe.experts)
    moe.load_state_dict(state)
    gate_up, _ = stacked_views(moe.experts)
    assert torch.equal(gate_up[2, :INNER], state["experts.2.gate_proj.weight"])


def test_the_checkpoint_written_for_sglang_holds_each_stacked_expert_by_name():
    """Dummy weights reach SGLang as a written checkpoint: views of one stack must be
    saved as the release's separate tensors, each with its own values."""
    import shutil

    from safetensors.torch import load_file

    from omni_qwen3_omni.loading import load_part
    from omni_qwen3_omni.thinker.sglang_adapter import write_checkpoint

    lm, _, root = load_part("tiny", "thinker", "dummy", "float32", "cpu")
    directory = write_checkpoint(lm, root)
    try:
        written = load_file(str(directory / "model.safetensors"))
    finally:
        shutil.rmtree(directory)
    state = lm.state_dict()
    assert set(written) == {f"thinker.{name}" for name in state}
    assert all(torch.equal(written[f"thinker.{name}"], value) for name, value in state.items())
    name = next(n for n in state if ".experts.1.up_proj." in n)
    assert written[f"thinker.{name}"].shape == state[name].shape


def test_row_routed_experts_stack_where_their_one_row_route_is_not_this_machines(monkeypatch):
    """RowLinear experts keep the loop only where its one-row mv is the faster kernel (the
    shipped routes); where this machine's routes send that row to F.linear, the grouped
    product serves them, with the loop's numbers."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice

    monkeypatch.setattr(cpu_linear, "_routes", KernelChoice())
    moe = _moe(dtype=torch.bfloat16)
    for layer in moe.modules():
        if type(layer) is torch.nn.Linear and layer is not moe.gate:
            layer.__class__ = cpu_linear.RowLinear
    x = _tokens(4, torch.bfloat16)
    assert not moe.uses_stack()
    with torch.no_grad():
        looped = moe(x)
    cpu_linear.use_routes(KernelChoice(0, False, 0, source="measured"))
    moe.__dict__.pop(expert_stack.STACK_CHECK, None)  # look again under the new routes
    assert moe.uses_stack() and lies_stacked(moe.experts)
    with torch.no_grad():
        torch.testing.assert_close(moe(x), looped, rtol=2e-2, atol=2e-2)


def test_bf16_experts_are_blocked_for_onednn_where_this_machines_routes_say_so(monkeypatch):
    """block_mixtures: each expert's gate/up become one blocked product (BlockedRows, one
    call), its down a BlockedLinear, all copies (the loop runs
    them, with the stack's numbers within a bf16 rounding), the stack is let go, and
    shared or float32 experts, or routes that keep dense weights, are left as they were."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice
    from omni_qwen3_omni.thinker.moe import block_mixtures

    if not cpu_linear.blocking_available():
        pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
    monkeypatch.setattr(cpu_linear, "_routes", KernelChoice(0, False, 0, source="measured"))
    moe = _moe(dtype=torch.bfloat16)
    x = _tokens(5, torch.bfloat16)
    with torch.no_grad():
        stacked = moe(x)
    assert moe.uses_stack()
    assert block_mixtures(moe) == 0  # dense routes: nothing to do
    cpu_linear.use_routes(KernelChoice(0, False, 0, bf16_blocked=True, source="measured"))
    holder = torch.nn.ModuleDict({"moe": moe, "f32": _moe(seed=3), "shared": _moe(seed=4)})
    holder["shared"].to(torch.bfloat16)
    for param in holder["shared"].parameters():
        param.share_memory_()  # a weight-sharing leader's
    assert block_mixtures(holder) == 3 * EXPERTS  # layers
    kinds = {
        name: type(getattr(expert, name)).__name__
        for expert in moe.experts
        for name in ("gate_proj", "up_proj", "down_proj")
    }
    assert kinds == {
        "gate_proj": "BlockedRows",
        "up_proj": "BlockedRows",
        "down_proj": "BlockedLinear",
    }
    assert not moe.uses_stack()
    products = []
    kernel = cpu_linear.BlockedLinear.forward
    monkeypatch.setattr(
        cpu_linear.BlockedLinear,
        "forward",
        lambda self, x: products.append(self) or kernel(self, x),
    )
    with torch.no_grad():
        moe.experts[0](x[:1])
    assert len(products) == 2  # gate/up in one call, then down
    monkeypatch.setattr(cpu_linear.BlockedLinear, "forward", kernel)
    assert type(holder["f32"].experts[0].gate_proj) is torch.nn.Linear
    assert type(holder["shared"].experts[0].gate_proj) is torch.nn.Linear
    with torch.no_grad():
        torch.testing.assert_close(moe(x), stacked, rtol=2e-2, atol=2e-2)
    assert block_mixtures(holder) == 0  # idempotent


def test_compiling_and_int8_take_blocked_experts_back(monkeypatch):
    """A compiled step turns the blocked experts dense again (``dense_linears``), int8 and
    w8a8_int8 quantize them (each expert's gate/up as the one product it is): same mixture."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.compiled import dense_linears
    from omni_core.engine.cpu_kernel_choice import KernelChoice
    from omni_core.engine.quantize import Int8Linear, quantize_linear_weights
    from omni_core.engine.w8a8 import W8A8Linear
    from omni_qwen3_omni.thinker.moe import block_mixtures

    if not cpu_linear.blocking_available():
        pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
    monkeypatch.setattr(cpu_linear, "_routes", KernelChoice(0, False, 0, True, 4))
    x = _tokens(3, torch.bfloat16)
    for convert in ("dense", "int8", "w8a8_int8"):
        moe = _moe(seed=5, dtype=torch.bfloat16)
        with torch.no_grad():
            want = moe(x)
        assert block_mixtures(moe) == 3 * EXPERTS
        if convert == "dense":
            assert dense_linears(moe) == 3 * EXPERTS
            assert type(moe.experts[0].gate_proj) is cpu_linear.RowLinear
        else:
            converted = quantize_linear_weights(moe, min_elements=1, scheme=convert)
            assert converted >= 2 * EXPERTS
            kind = Int8Linear if convert == "int8" else W8A8Linear
            assert isinstance(moe.experts[0].down_proj, kind)
        with torch.no_grad():
            tolerance = 2e-2 if convert == "dense" else 1e-1
            torch.testing.assert_close(moe(x), want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("floor", [0, 4])
def test_blocked_experts_run_past_their_modules_with_the_modules_numbers(monkeypatch, floor):
    """``blocked_experts``: each blocked expert as two oneDNN calls, rows padded once per
    call (a short expert reads into its neighbour's rows): bit for bit what the
    modules give, at one token and at several, padded or not."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice
    from omni_qwen3_omni.thinker import blocked_experts
    from omni_qwen3_omni.thinker import moe as moe_module
    from omni_qwen3_omni.thinker.moe import block_mixtures

    if not cpu_linear.blocking_available():
        pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
    monkeypatch.setattr(cpu_linear, "_routes", KernelChoice(0, False, 0, True, floor))
    moe = SparseMoE(HIDDEN, INNER, EXPERTS, 4).eval()  # four a token: the sum's order shows
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    moe = moe.to(torch.bfloat16)
    assert blocked_experts.blocked_floor(moe.experts) is None  # not blocked yet
    assert block_mixtures(moe) == 3 * EXPERTS
    assert blocked_experts.blocked_floor(moe.experts) == floor
    ran = []
    product = blocked_experts.blocked_product
    monkeypatch.setattr(blocked_experts, "blocked_product", lambda *a: ran.append(1) or product(*a))
    for count in (1, 3, 8, 17):
        x = _tokens(count, torch.bfloat16, seed=count)
        with torch.no_grad():
            weights, experts = moe.route(x)
            ran.clear()
            got = moe._loop(x, weights, experts)
            # two products per touched expert: its gate/up and its down
            assert len(ran) == 2 * len(set(experts.reshape(-1).tolist()))
            monkeypatch.setattr(moe_module, "blocked_floor", lambda experts: None)
            want = moe._loop(x, weights, experts)  # through the expert modules
            monkeypatch.setattr(moe_module, "blocked_floor", blocked_experts.blocked_floor)
        assert torch.equal(got, want), count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_experts_quantise_each_products_rows_once_with_the_modules_numbers(monkeypatch, dtype):
    """``w8a8_experts``: a mixture's gathered rows quantised once for every expert's gate/up
    and once for every down, instead of per expert: two quantisations a call, and bit for
    bit what the expert modules give (rows are quantised one by one either way)."""
    from omni_core.engine import w8a8
    from omni_core.engine.quantize import quantize_linear_weights
    from omni_qwen3_omni.thinker import moe as moe_module
    from omni_qwen3_omni.thinker import w8a8_experts

    if w8a8.w8a8_problem() is not None:
        pytest.skip(w8a8.w8a8_problem())
    moe = SparseMoE(HIDDEN, INNER, EXPERTS, 4).eval()  # four a token: the sum's order shows
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    moe = moe.to(dtype)
    assert not w8a8_experts.w8a8_ready(moe.experts)
    assert quantize_linear_weights(moe, min_elements=1, scheme="w8a8_int8") >= 2 * EXPERTS
    assert w8a8_experts.w8a8_ready(moe.experts)
    quantised = []
    rows = w8a8_experts.quantize_rows
    monkeypatch.setattr(w8a8_experts, "quantize_rows", lambda r: quantised.append(1) or rows(r))
    for count in (1, 3, 8, 17):
        x = _tokens(count, dtype, seed=count)
        with torch.no_grad():
            weights, experts = moe.route(x)
            quantised.clear()
            got = moe._loop(x, weights, experts)
            assert len(quantised) == 2
            monkeypatch.setattr(moe_module, "w8a8_ready", lambda experts: False)
            want = moe._loop(x, weights, experts)  # through the expert modules
            monkeypatch.setattr(moe_module, "w8a8_ready", w8a8_experts.w8a8_ready)
        assert torch.equal(got, want), count


def test_experts_with_float16_row_copies_take_them_unpadded_with_the_modules_numbers(
    monkeypatch,
):
    """``factory.fp16_row_weights``: blocked experts that hold float16 copies run their
    one or two rows through them, unpadded (a floor would send every expert to its
    blocked weight), and the direct path still gives the modules' numbers bit for bit."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice
    from omni_core.engine.cpu_row_copy import add_row_copies, row_copies_available
    from omni_qwen3_omni.thinker import blocked_experts
    from omni_qwen3_omni.thinker import moe as moe_module
    from omni_qwen3_omni.thinker.moe import block_mixtures

    if not (cpu_linear.blocking_available() and row_copies_available()):
        pytest.skip("this torch build or CPU has no oneDNN bf16 product or no fbgemm")
    monkeypatch.setattr(cpu_linear, "_routes", KernelChoice(0, False, 0, True, 4))
    moe = _moe(seed=7, dtype=torch.bfloat16)
    block_mixtures(moe)
    plain = {count: None for count in (1, 3, 8, 17)}
    for count in plain:
        x = _tokens(count, torch.bfloat16, seed=count)
        with torch.no_grad():
            plain[count] = moe._loop(x, *moe.route(x))
    assert add_row_copies(moe) == 2 * EXPERTS  # each expert's gate/up product and its down
    assert blocked_experts.blocked_floor(moe.experts) == 0
    copied = []
    through_copy = blocked_experts.row_copy_float
    monkeypatch.setattr(
        blocked_experts, "row_copy_float", lambda *a: copied.append(1) or through_copy(*a)
    )
    for count, before in plain.items():
        x = _tokens(count, torch.bfloat16, seed=count)
        with torch.no_grad():
            weights, experts = moe.route(x)
            copied.clear()
            got = moe._loop(x, weights, experts)
            # the experts given one or two rows, and only they, took their copies
            rows = torch.bincount(experts.reshape(-1), minlength=EXPERTS).tolist()
            assert len(copied) == 2 * sum(0 < n <= 2 for n in rows), (count, rows)
            monkeypatch.setattr(moe_module, "blocked_floor", lambda experts: None)
            want = moe._loop(x, weights, experts)  # through the expert modules
            monkeypatch.setattr(moe_module, "blocked_floor", blocked_experts.blocked_floor)
        assert torch.equal(got, want), count
        # bf16's products up to summation order: close to the blocked weights' answer
        torch.testing.assert_close(got, before, rtol=3e-2, atol=3e-2)


def test_experts_made_dense_again_leave_the_blocked_path(monkeypatch):
    from omni_core.engine import cpu_linear
    from omni_core.engine.compiled import dense_linears
    from omni_core.engine.cpu_kernel_choice import KernelChoice
    from omni_qwen3_omni.thinker.blocked_experts import blocked_floor
    from omni_qwen3_omni.thinker.moe import block_mixtures

    if not cpu_linear.blocking_available():
        pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
    monkeypatch.setattr(cpu_linear, "_routes", KernelChoice(0, False, 0, True, 4))
    moe = _moe(seed=5, dtype=torch.bfloat16)
    block_mixtures(moe)
    assert blocked_floor(moe.experts) == 4
    dense_linears(moe)
    assert blocked_floor(moe.experts) is None


@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
# the int8 mixture stays in make test; the blocked one compiles oneDNN-packed experts
# (~20 s of inductor here): make test-all
@pytest.mark.parametrize("experts", [pytest.param("blocked", marks=pytest.mark.slow), "int8"])
def test_a_compiled_mixture_loops_through_one_operator_without_a_graph_break(monkeypatch, experts):
    """Experts that loop (blocked for oneDNN, int8) are one ``omni::looped_mixture`` node
    in a compiled graph: ``fullgraph=True`` compiles (a graph break would raise), the
    router is traced and the loop runs eager's kernels, so the outputs are eager's."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice
    from omni_qwen3_omni.thinker import looped_op
    from omni_qwen3_omni.thinker.moe import block_mixtures

    moe = _moe(seed=5, dtype=torch.bfloat16)
    if experts == "blocked":
        if not cpu_linear.blocking_available():
            pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
        monkeypatch.setattr(cpu_linear, "_routes", KernelChoice(0, False, 0, True, 4))
        assert block_mixtures(moe) == 3 * EXPERTS
    else:
        assert quantize_linear_weights(moe, min_elements=1) >= 2 * EXPERTS
    assert not moe.uses_stack()
    calls = []
    loop = SparseMoE._loop
    monkeypatch.setattr(SparseMoE, "_loop", lambda self, *a: calls.append(self) or loop(self, *a))
    torch._dynamo.reset()
    compiled = torch.compile(moe, dynamic=False, fullgraph=True)
    with torch.no_grad():
        for rows in (1, 3, 8):
            x = _tokens(rows, torch.bfloat16, seed=rows)
            want = moe(x)
            calls.clear()
            torch.testing.assert_close(compiled(x), want, atol=0, rtol=0)
            assert calls == [moe]  # the loop ran once, through the operator
        # the graph reaches the mixture through its number only
        monkeypatch.delitem(looped_op.MIXTURES, int(moe.handle))
        with pytest.raises(KeyError):
            compiled(x)


def test_a_copied_mixture_is_found_by_a_number_of_its_own():
    """A deep copy (or an unpickled mixture) is another mixture: it must not answer to the
    original's number, or a compiled copy would run the original's experts."""
    import copy
    import gc

    from omni_qwen3_omni.thinker import looped_op

    moe = _moe(seed=2)
    twin = copy.deepcopy(moe)
    assert int(twin.handle) != int(moe.handle)
    assert looped_op.MIXTURES[int(twin.handle)] is twin
    assert looped_op.MIXTURES[int(moe.handle)] is moe
    number = int(twin.handle)
    del twin
    gc.collect()
    assert number not in looped_op.MIXTURES


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_lone_token_skips_the_gathers_and_sums_as_the_loop_does(dtype):
    """One token: its experts run on it directly, and the sum is the loop's (ascending
    expert, each output weighted, then added to a zero start) bit for bit."""
    moe = _moe(seed=7, dtype=dtype)
    x = _tokens(1, dtype, seed=9)
    with torch.no_grad():
        weights, experts = moe.route(x)
        want = torch.zeros_like(x)
        for slot in experts[0].argsort().tolist():  # the loop's order: ascending expert
            rows = moe.experts[int(experts[0, slot])](x)
            want.index_add_(0, torch.tensor([0]), rows * weights[0, slot : slot + 1][:, None])
        seen = []
        for expert in moe.experts:
            expert.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
        got = moe._looped(x)
    assert torch.equal(got, want)
    assert len(seen) == TOP_K and all(t is x for t in seen)  # the token itself, no copy
