"""WarmCompiled: compiled at start-up, then never compiled again while serving."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.warm_compiled import WarmCompiled  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")


def _scaled_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum(-1) + 1


@torch.library.custom_op("omni_test::refuses_positive", mutates_args=())
def _refuses_positive_op(x: torch.Tensor) -> torch.Tensor:
    """An operator the graph calls as it is, failing on what it reads (not on a guard)."""
    if bool((x > 0).any()):
        raise RuntimeError("the model's own error")
    return x * 2


@_refuses_positive_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _refuses_positive(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.omni_test.refuses_positive(x) + 1


def test_a_call_of_a_compiled_shape_runs_its_graph_and_equals_eager():
    fn = WarmCompiled("toy", _scaled_sum)
    example = (torch.randn(2, 8), torch.randn(8))
    fn.compile(*example)
    x, w = torch.randn(2, 8), torch.randn(8)
    got = fn(x, w)
    assert got is not None and torch.allclose(got, _scaled_sum(x, w))
    assert (fn.graphs, fn.calls, fn.misses) == (1, 1, 0)


def test_a_shape_nobody_compiled_answers_none_and_warns_once(caplog):
    # None tells the caller to take its uncompiled path: a compile mid-serving would stall
    # every running request. A second call of the same shape still answers None, so the
    # first did not compile it either.
    fn = WarmCompiled("toy frame", _scaled_sum)
    fn.compile(torch.randn(2, 8), torch.randn(8))
    with caplog.at_level(logging.WARNING, logger="omni_core.engine.warm_compiled"):
        assert fn(torch.randn(4, 8), torch.randn(8)) is None
        assert fn(torch.randn(4, 8), torch.randn(8)) is None
    assert (fn.graphs, fn.calls, fn.misses) == (1, 0, 2)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "toy frame: a call missed every graph compiled at start-up" in warnings[0]


def test_under_a_dispatch_mode_it_answers_none_without_a_warning(caplog):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    fn = WarmCompiled("toy", _scaled_sum)
    example = (torch.randn(2, 8), torch.randn(8))
    fn.compile(*example)
    with caplog.at_level(logging.WARNING), Counting():
        assert fn(*example) is None
    assert not caplog.records and fn.misses == 0


def test_the_functions_own_errors_are_not_taken_for_a_miss():
    fn = WarmCompiled("toy", _refuses_positive)
    fn.compile(-torch.ones(2))
    with pytest.raises(RuntimeError, match="the model's own error"):
        fn(torch.ones(2))
    assert fn.misses == 0
