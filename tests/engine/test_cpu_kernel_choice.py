"""``omni_core.engine.cpu_kernel_choice``: this machine's CPU kernel routes, measured once, cached.

The timings are injected (no test depends on this machine's speed); the
kernels themselves run, and each pair timed must compute the same product.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine import cpu_kernel_choice as choice_module  # noqa: E402
from omni_core.engine import cpu_linear  # noqa: E402
from omni_core.engine.cpu_kernel_choice import (  # noqa: E402
    KernelChoice,
    beats,
    kernel_choice,
    leading_wins,
    measure,
    read_cached,
    write_cached,
)


def test_a_route_is_taken_for_the_row_counts_it_wins_from_the_first_on():
    assert leading_wins((1, 2, 4, 8), lambda rows: rows <= 2) == 2
    assert leading_wins((1, 2, 4, 8), lambda rows: rows != 2) == 1  # no holes: 4, 8 lost
    assert leading_wins((1, 2, 4, 8), lambda rows: False) == 0
    assert leading_wins((1, 2, 4, 8), lambda rows: True) == 8


BEFORE_BLOCKING = (
    *(1, 2, 1, 2, 2, 1),  # float32: (MKL, oneDNN) at 1, 2, 3 rows
    *(2, 1),  # bf16 one row: (mv, F.linear)
    *(1, 2, 1, 2, 1, 2, 2, 1),  # bf16: (transposed, F.linear) at 2, 4, 8, 16 rows
)


@pytest.mark.parametrize(
    ("blocking", "min_rows"),
    [
        ((1, 2, 1, 2, 1, 2, 1, 2), 4),  # blocked wins at 1 and 8 rows; padded at 1 and 2
        ((1, 2, 1, 2, 5, 4, 1, 3), 4),  # padding loses a second at 1 row, saves 2 at 2
        ((1, 2, 1, 2, 1, 2, 3, 1), 0),  # saves 1 at 1 row, loses 2 at 2
        ((1, 2, 2, 1), 0),  # blocked loses at 8 rows: padding is not timed
    ],
)
def test_measuring_times_each_pair_of_kernels_on_the_same_product(blocking, min_rows, monkeypatch):
    """Scripted seconds, in the order the pairs are timed: MKL wins float32 at 1 and 2 rows
    and loses at 3; mv loses to F.linear; the transposed product wins up to 8 rows; then
    the blocked bf16 weight against the dense routes (F.linear at 1 row, transposed at 8)
    and, where it won, blocked decoder layers padded to four rows against unpadded at 1 and
    2 rows: padded where that saves time over both together."""
    if not cpu_linear.blocking_available():
        pytest.skip("this torch build or CPU has no oneDNN bf16 inner product")
    # the timings are scripted, so passes of the fewest layers (64 MB) check the same:
    # a large L3 (or a guest reporting its host's) made each case take 13 s
    monkeypatch.setattr(choice_module, "last_level_cache_bytes", lambda: None)
    script = iter([*BEFORE_BLOCKING, *blocking])
    results = []

    def timer(call):
        results.append(call())
        return next(script)

    chosen = measure(timer)
    blocked = len(blocking) > 4
    assert chosen == KernelChoice(2, False, 8, blocked, min_rows, source="measured")
    assert next(script, None) is None  # every pair timed, none after a loss
    pairs = list(zip(results[::2], results[1::2], strict=True))
    for fast_layers, slow_layers in pairs:
        assert len(fast_layers) == len(slow_layers) >= 1  # every layer of a pass
        for fast, slow in zip(fast_layers, slow_layers, strict=True):
            torch.testing.assert_close(
                fast.float().reshape(slow.shape), slow.float(), atol=0.05, rtol=0.02
            )
    widths = [{slow.shape[-1] for slow in slow_layers} for _, slow_layers in pairs]
    padding_pairs = 2 if blocked else 0  # timed through whole decoder layers, at 1 and 2 rows
    single = widths[: len(widths) - padding_pairs]
    assert single == [{choice_module.SHAPE[0]}] * len(single)
    assert widths[len(single) :] == [{1024, 3072, 4096}] * padding_pairs


def test_a_route_within_the_margin_of_the_other_leaves_the_shipped_choice():
    assert beats(1.0, 1.04, shipped=False) is False  # 4 % faster: a tie on a shared machine
    assert beats(1.04, 1.0, shipped=True) is True
    assert beats(1.0, 1.2, shipped=False) is True  # clearly faster: measured wins
    assert beats(1.2, 1.0, shipped=True) is False


def test_measuring_close_calls_everywhere_gives_the_shipped_routes(monkeypatch):
    """Every candidate route 3 % faster than the one it is timed against: noise, so each
    choice stays the shipped one (MKL up to 3 float32 rows, mv, transposed, not blocked)."""
    monkeypatch.setattr(choice_module, "last_level_cache_bytes", lambda: None)
    script = iter([1.0, 1.03] * 64)
    chosen = measure(lambda call: next(script))
    shipped = KernelChoice()
    assert chosen == KernelChoice(
        shipped.mkl_max_rows,
        shipped.bf16_mv_one_row,
        shipped.bf16_transposed_max_rows,
        shipped.bf16_blocked,
        shipped.bf16_blocked_min_rows,
        source="measured",
    )


def test_without_onednn_every_float32_row_stays_on_mkl():
    seconds = iter([1.0, 2.0] + [1.0, 2.0] * len(choice_module.BF16_ROWS))
    chosen = measure(lambda call: next(seconds), onednn=False)
    assert chosen.mkl_max_rows == choice_module.FLOAT32_ROWS[-1]
    assert chosen.bf16_mv_one_row and chosen.bf16_transposed_max_rows == 64


def test_the_cache_keeps_one_answer_per_machine_key_and_survives_a_bad_file(tmp_path):
    path = tmp_path / "omni" / "cpu_kernels.json"
    assert read_cached(path, "cpu A") is None
    write_cached(path, "cpu A", KernelChoice(0, False, 0, source="measured"))
    write_cached(path, "cpu B", KernelChoice(3, True, 64, source="measured"))
    assert read_cached(path, "cpu A") == KernelChoice(0, False, 0, source=str(path))
    assert read_cached(path, "cpu B").mkl_max_rows == 3
    assert set(json.loads(path.read_text())) == {"cpu A", "cpu B"}
    assert not list(path.parent.glob("*.tmp"))  # written atomically, nothing left behind
    path.write_text("{not json")
    assert read_cached(path, "cpu A") is None
    # replaces the bad file
    write_cached(path, "cpu A", KernelChoice(1, True, 2, source="measured"))
    assert read_cached(path, "cpu A").bf16_transposed_max_rows == 2
    path.write_text(json.dumps({"cpu A": {"mkl_max_rows": 1, "renamed_field": 2}}))
    assert read_cached(path, "cpu A") is None  # another version's entry: measured again
    before_blocked = {"mkl_max_rows": 0, "bf16_mv_one_row": False, "bf16_transposed_max_rows": 0}
    path.write_text(json.dumps({"cpu A": before_blocked}))
    assert read_cached(path, "cpu A") is None  # written before a route existed: measured


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(choice_module, "_chosen", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "omni" / "cpu_kernels.json"


def test_a_process_measures_once_then_later_starts_read_the_cache(fresh, monkeypatch):
    monkeypatch.setenv("OMNI_CPU_KERNELS", "measure")
    measured = KernelChoice(0, False, 0, source="measured")
    calls = []
    monkeypatch.setattr(choice_module, "measure", lambda **kw: calls.append(kw) or measured)
    assert kernel_choice() == measured and kernel_choice() == measured
    assert len(calls) == 1 and fresh.exists()
    monkeypatch.setattr(choice_module, "_chosen", None)  # the next process
    assert kernel_choice() == KernelChoice(0, False, 0, source=str(fresh))
    assert len(calls) == 1
    monkeypatch.setattr(choice_module, "_chosen", None)
    monkeypatch.setenv("OMNI_CPU_KERNELS", "remeasure")
    kernel_choice()
    assert len(calls) == 2


def test_default_takes_the_shipped_routes_and_a_wrong_mode_says_what_to_use(fresh, monkeypatch):
    monkeypatch.setenv("OMNI_CPU_KERNELS", "default")
    monkeypatch.setattr(choice_module, "measure", lambda **kw: pytest.fail("measured"))
    assert kernel_choice() == KernelChoice()
    assert not fresh.exists()
    monkeypatch.setattr(choice_module, "_chosen", None)
    monkeypatch.setenv("OMNI_CPU_KERNELS", "fastest")
    with pytest.raises(ValueError, match="OMNI_CPU_KERNELS='fastest': use one of measure"):
        kernel_choice()


def test_layers_follow_the_routes_in_force_with_the_same_values(monkeypatch):
    """The AMD routes (every product on F.linear or oneDNN) give what the shipped ones give."""
    monkeypatch.setattr(cpu_linear, "_routes", cpu_linear.routes())
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 512, bias=False).to(torch.bfloat16)
    rows = {n: torch.randn(n, 256).to(torch.bfloat16) for n in (1, 4)}
    shipped = {n: cpu_linear.row_linear(x, layer.weight) for n, x in rows.items()}
    cpu_linear.use_routes(KernelChoice(0, False, 0, source="measured"))

    def no_mv(*args):
        raise AssertionError("torch.mv taken against the routes")

    monkeypatch.setattr(torch, "mv", no_mv)
    for n, x in rows.items():
        routed = cpu_linear.row_linear(x, layer.weight)
        torch.testing.assert_close(
            routed, torch.nn.functional.linear(x, layer.weight), rtol=0, atol=0
        )
        torch.testing.assert_close(routed.float(), shipped[n].float(), atol=0.05, rtol=0.02)
        assert cpu_linear.row_product(x, layer.weight).shape == (n, 512)
    if cpu_linear.packing_available():
        dense = torch.nn.Linear(256, 512)
        packed = cpu_linear.PackedLinear(dense)
        assert "rows<=0: MKL" in packed.extra_repr()
        x = torch.randn(1, 256)
        torch.testing.assert_close(packed(x), dense(x), atol=1e-5, rtol=1e-5)


def test_packing_takes_this_machines_routes(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_routes", cpu_linear.routes())
    mine = KernelChoice(1, False, 16, source="measured")
    monkeypatch.setattr(cpu_linear, "kernel_choice", lambda onednn: mine)
    cpu_linear.pack_linear_weights(torch.nn.Sequential(torch.nn.Linear(8, 8)))
    assert cpu_linear.routes() == mine


def test_a_timed_pass_reads_more_than_the_cache_holds():
    layer = 12_582_912  # a 1024x3072 float32 layer
    assert choice_module.layer_count(32 << 20, layer) == 11  # 128 MB past a 32 MB L3
    assert choice_module.layer_count(None, layer) == 6  # 64 MB where sysfs does not say
    assert choice_module.layer_count(1 << 10, 1 << 30) == 1
    # a guest's sysfs reporting its host's 260 MiB L3: 512 MB, not four times that
    assert choice_module.layer_count(260 << 20, layer) == 43
