"""``benchmarks/roofline.py``: the bytes a step reads, counted op by op, and the limit's figures.

The counts are checked against sizes worked out by hand from the layers'
shapes (no timing: nothing here depends on the machine's speed).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.cpu_linear import PackedLinear, packing_available
from omni_core.engine.quantize import Int8Linear

ROOFLINE = Path(__file__).resolve().parents[2] / "benchmarks" / "roofline.py"


@pytest.fixture(scope="module")
def roofline() -> Iterator[ModuleType]:
    """The scripts' helper, loaded by path (``benchmarks/`` is not a package)."""
    name = "benchmarks_roofline_under_test"
    spec = importlib.util.spec_from_file_location(name, ROOFLINE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


def test_a_step_counts_every_read_of_the_weights_it_touches_and_the_rows_it_gathers(roofline):
    torch.manual_seed(0)
    table = nn.Embedding(100, 16)
    dense = nn.Linear(16, 8)
    experts = nn.ModuleList(nn.Linear(16, 16, bias=False) for _ in range(4))
    unused = nn.Linear(16, 16)
    model = nn.ModuleDict({"table": table, "dense": dense, "experts": experts, "unused": unused})
    reads = roofline.StepReads(model)
    with torch.inference_mode(), reads:
        x = table(torch.tensor([[3, 7, 3]]))  # three rows gathered, not the whole table
        dense(x)
        dense(x)  # the same weight again (a code predictor's steps): read again
        experts[2](x)  # one expert of four
        dense.weight[:2].sum()  # a slice reads only its rows
    rows = 3 * 16 * 4
    expected = rows + 2 * (16 * 8 + 8) * 4 + 16 * 16 * 4 + 2 * 16 * 4
    assert reads.bytes == expected
    with reads:  # a new block starts from zero
        experts[0](torch.ones(1, 16))
    assert reads.bytes == 16 * 16 * 4


def test_a_grouped_product_counts_only_the_experts_given_rows(roofline):
    """The thinker's float32 mixture runs its experts as one grouped product over the
    whole stack; a step reads the experts its tokens picked, not all of them (the count
    was every expert's, 328 % of the limit at one request)."""
    stack = nn.Module()
    stack.gate_up = nn.Parameter(torch.randn(6, 16, 8), requires_grad=False)
    reads = roofline.StepReads(stack)
    rows = torch.randn(3, 8)
    ends = torch.tensor([0, 2, 2, 2, 3, 3], dtype=torch.int32)  # experts 1 and 4 given rows
    with torch.inference_mode(), reads:
        out = F.grouped_mm(rows, stack.gate_up.transpose(1, 2), offs=ends)
    assert out.shape == (3, 16)
    assert reads.bytes == 2 * 16 * 8 * 4


def test_int8_and_packed_layers_count_their_own_bytes_in_the_thread_that_runs_them(roofline):
    quantized = Int8Linear(nn.Linear(64, 32).to(torch.bfloat16))
    layers: dict[str, nn.Module] = {"int8": quantized}
    packed_bytes = 0
    if packing_available():
        layers["packed"] = PackedLinear(nn.Linear(64, 32, bias=False))
        packed_bytes = 64 * 32 * 4
    reads = roofline.StepReads(nn.ModuleDict(layers))
    counted: list[int] = []

    def step() -> None:  # dispatch modes are per thread: the engine runs steps in a worker
        with torch.inference_mode(), reads:
            quantized(torch.ones(1, 64, dtype=torch.bfloat16))
            if "packed" in layers:
                layers["packed"](torch.ones(1, 64))
        counted.append(reads.bytes)

    worker = threading.Thread(target=step)
    worker.start()
    worker.join()
    # int8 weights, bf16 per-channel scales and bias
    assert counted == [64 * 32 + 32 * 2 + 32 * 2 + packed_bytes]
    with reads:  # in this thread, nothing ran: nothing counted
        pass
    assert reads.bytes == 0


def test_a_blocked_group_counts_its_product_once_per_call(roofline, monkeypatch):
    """q/k/v blocked as one product (``BlockedRows``): the product lies outside the module
    tree, held by the members, and one call of the group reads it once."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_kernel_choice import KernelChoice
    from omni_core.engine.fused_linear import project

    if not cpu_linear.blocking_available():
        pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
    chosen = KernelChoice(0, False, 0, bf16_blocked=True, source="test")
    monkeypatch.setattr(cpu_linear, "_routes", cpu_linear.routes())
    monkeypatch.setattr(cpu_linear, "kernel_choice", lambda onednn=True: chosen)

    class Attention(nn.Module):
        blocked_siblings = (("q", "k", "v"),)

        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(256, n, bias=False) for n in (512, 256, 256))

    attention = Attention().to(torch.bfloat16)
    cpu_linear.pack_linear_weights(attention)
    assert type(attention.q) is cpu_linear.BlockedRows
    reads = roofline.StepReads(attention)
    with torch.inference_mode(), reads:
        project(torch.ones(1, 256, dtype=torch.bfloat16), attention.q, attention.k, attention.v)
    assert reads.bytes == 1024 * 256 * 2


def test_a_float16_row_copy_counts_its_own_bytes_where_it_is_read(roofline):
    """``factory.fp16_row_weights``: one row reads the float16 copy (an fbgemm object, not
    a tensor), more rows the blocked weight; each counts a weight's two bytes."""
    from omni_core.engine import cpu_linear
    from omni_core.engine.cpu_row_copy import add_row_copies, row_copies_available

    if not (cpu_linear.blocking_available() and row_copies_available()):
        pytest.skip("this torch build or CPU has no oneDNN bf16 product or no fbgemm")
    model = nn.Sequential(cpu_linear.BlockedLinear(nn.Linear(256, 96).to(torch.bfloat16)))
    assert add_row_copies(model) == 1
    reads = roofline.StepReads(model)
    for rows in (1, 4):
        with torch.inference_mode(), reads:
            model(torch.ones(rows, 256, dtype=torch.bfloat16))
        assert reads.bytes == 96 * 256 * 2 + 96 * 2, rows  # the weight and the bias


def test_a_decode_watch_times_every_call_but_the_counted_one_and_can_count_none(roofline):
    layer = nn.Linear(16, 8)

    class StepModel:
        def decode(self, sequences, cache):
            return layer(torch.ones(1, 16))

    model = StepModel()
    counting = roofline.DecodeWatch(model, layer, count_at=1)
    sequence = SimpleNamespace(cached=5)
    for _ in range(3):
        model.decode([sequence], None)
    counting.close()
    assert counting.bytes == (16 * 8 + 8) * 4 and len(counting.seconds) == 2
    assert "decode" not in model.__dict__  # closed: the class's method again
    timing = roofline.DecodeWatch(model, layer, count_at=None)
    for _ in range(3):
        model.decode([sequence], None)
    timing.close()
    assert timing.bytes == 0 and len(timing.seconds) == 3 and timing.mean_positions() == 5


def test_kv_bytes_and_the_printed_percentage(roofline):
    assert roofline.kv_bytes(2, 4, 128, 10, torch.bfloat16) == 2 * 2 * 4 * 128 * 10 * 2
    limit = roofline.Bandwidth(gb_s=10.0, how="sum", threads=1)
    line = roofline.limit_line("ours", 1e9, 0.0, 0.2, limit)  # 1 GB at 10 GB/s: 100 ms of 200
    assert "1.000 GB of weights" in line
    assert "100.0 ms" in line and "200.0 ms" in line
    assert "50% of the memory-bandwidth limit" in line
    assert "against the run's lowest" not in line  # one measurement: nothing to compare
    low, high = limit, roofline.Bandwidth(gb_s=12.0, how="sum", threads=1)
    kept = roofline.best(low, high)
    assert kept.gb_s == 12.0 and kept.lowest_gb_s == 10.0
    assert roofline.best(high, high) is high
    # 1.2 GB at 12 GB/s: 100 ms of 200; at the lowest, 10 GB/s, 120 ms: 60%
    line = roofline.limit_line("ours", 1.2e9, 0.0, 0.2, kept)
    assert "50% of the memory-bandwidth limit (60% against the run's lowest" in line
    assert "10.0 GB/s)" in line
    paged = roofline.Bandwidth(gb_s=10.0, how="sum", threads=1, pages="2 MB pages")
    assert "(10.0 GB/s, sum, 1 thread(s), 2 MB pages) " in roofline.limit_line("o", 1, 0, 1, paged)


def test_the_sustained_rate_is_the_median_pass_of_every_measurement(roofline):
    start = roofline.Bandwidth(gb_s=90.0, how="sum", threads=2, passes=(90.0, 52.0, 50.0))
    end = roofline.Bandwidth(gb_s=54.0, how="sum", threads=2, passes=(54.0, 53.0))
    kept = roofline.best(start, end)
    assert kept.gb_s == 90.0 and kept.lowest_gb_s == 54.0
    assert kept.passes == (90.0, 52.0, 50.0, 54.0, 53.0) and kept.sustained_gb_s == 53.0
    # 1.06 GB: 11.8 ms at the best pass, 20 ms at the sustained 53 GB/s; the step takes 25 ms
    line = roofline.limit_line("ours", 1.06e9, 0.0, 0.025, kept)
    assert "47% of the memory-bandwidth limit" in line
    assert "80% of the sustained rate (the median of 5 passes, 53.0 GB/s)" in line
    one_pass = roofline.Bandwidth(gb_s=10.0, how="sum", threads=1, passes=(10.0,))
    assert one_pass.sustained_gb_s is None
    assert "sustained" not in roofline.limit_line("ours", 1e9, 0.0, 0.2, one_pass)


def test_read_bandwidth_reports_a_rate_with_the_threads_in_use(roofline):
    from omni_core.engine.compute import compute_thread

    # the compute thread's: the caller's, unless a script in this process dedicated it
    # (an in-process benchmark test before this one may have), as the steps it measures
    in_use = compute_thread().threads or torch.get_num_threads()
    measured = roofline.read_bandwidth(megabytes=4, passes=1)
    assert measured.gb_s > 0
    assert measured.passes == (measured.gb_s,) and measured.sustained_gb_s is None
    three = roofline.read_bandwidth(megabytes=4, passes=3)
    assert len(three.passes) == 3 and max(three.passes) == three.gb_s
    assert min(three.passes) <= three.sustained_gb_s <= three.gb_s
    assert measured.threads == in_use
    assert measured.how in ("sum", "float32 matrix-vector")
    # which pages the buffer got, where /proc says (this test process did not ask for huge
    # pages unless its environment did: torch decides at the first allocation)
    assert measured.pages in (None, "2 MB pages", "4 KB pages")


def test_a_recorded_step_keeps_its_weight_reading_ops_with_the_inputs_they_had(roofline):
    """``record=True``: the ops that read a weight, and only those, each with a copy of its
    other inputs as they were (an in-place op after it must not change what a replay
    computes), the weights themselves by reference (no copy of a model's weights)."""
    torch.manual_seed(0)
    dense = nn.Linear(16, 8)
    norm = nn.LayerNorm(8)
    model = nn.ModuleDict({"dense": dense, "norm": norm})
    reads = roofline.StepReads(model, record=True)
    x = torch.randn(2, 16)
    with torch.inference_mode(), reads:
        hidden = dense(x)
        expected = hidden.clone()
        hidden.mul_(0.0)  # in place, after the product: reads no weight, not kept
        out = norm(hidden + 1.0)
        x.zero_()  # the product's input, changed after it ran
    names = [op.func._schema.name for op in reads.ops]
    assert names == ["aten::linear", "aten::layer_norm"]
    product = reads.ops[0]
    assert any(a is dense.weight for a in product.args)  # the weight itself, not a copy
    with torch.inference_mode():
        assert torch.equal(product.run(), expected)  # the input as it was, not zeros
        assert torch.equal(reads.ops[1].run(), out)
    with torch.inference_mode(), reads:  # a new block starts empty
        dense(torch.ones(1, 16))
    assert len(reads.ops) == 1
    counting_only = roofline.StepReads(model)
    with torch.inference_mode(), counting_only:
        dense(torch.ones(1, 16))
    assert counting_only.ops == [] and counting_only.bytes == (16 * 8 + 8) * 4


def test_the_recorded_ops_run_again_on_the_compute_thread(roofline):
    """kernel_seconds runs the ops where the steps ran (the compute thread), each once
    untimed and then ``passes`` times; a count of calls, not a speed, is checked."""
    from omni_core.engine.compute import compute_thread

    calls: list[threading.Thread] = []

    def product(x: torch.Tensor) -> torch.Tensor:
        calls.append(threading.current_thread())
        return x * 2

    ops = [roofline.RecordedOp(product, (torch.ones(3),), {}) for _ in range(2)]
    seconds = roofline.kernel_seconds(ops, passes=3)
    assert seconds >= 0 and len(calls) == 2 * (1 + 3)
    assert set(calls) == {compute_thread().thread}
    assert roofline.kernel_seconds([]) == 0.0


def test_the_kernels_line_splits_a_step_into_its_kernels_and_the_rest(roofline):
    limit = roofline.Bandwidth(gb_s=10.0, how="sum", threads=1)
    # 1 GB of weights: 100 ms at the limit; the kernels alone took 125 ms of a 200 ms step
    line = roofline.kernels_line(412, 1e9, 0.125, 0.2, limit)
    assert "its 412 weight-reading ops alone" in line
    assert "125.0 ms (8.0 GB/s of weights, 80% of the limit)" in line
    assert "the framework around them): 75.0 ms" in line
