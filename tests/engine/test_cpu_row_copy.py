"""float16 copies of blocked bf16 weights for fbgemm's one- and two-row kernel
(``factory.fp16_row_weights``, omni_core.engine.cpu_row_copy)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from omni_core.engine import cpu_row_copy  # noqa: E402
from omni_core.engine.cpu_blocked_weight import blocked_product  # noqa: E402
from omni_core.engine.cpu_linear import BlockedLinear, blocking_available  # noqa: E402
from omni_core.engine.cpu_row_copy import (  # noqa: E402
    ROW_COPY_MAX_ROWS,
    add_row_copies,
    apply_row_copies,
    row_copies_available,
    row_copy_product,
)

pytestmark = pytest.mark.skipif(
    not (blocking_available() and row_copies_available()),
    reason="this torch build or CPU has no oneDNN bf16 product or no fbgemm",
)


def _model(bias: bool = True) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 96, bias=bias), nn.Linear(96, 64, bias=False))
    model.to(torch.bfloat16)
    model[0] = BlockedLinear(model[0])
    model[1] = BlockedLinear(model[1])
    return model


def test_one_and_two_rows_take_the_copy_and_more_rows_the_blocked_weight():
    model = _model()
    assert add_row_copies(model) == 2
    layer = model[0]
    copy_ = layer.__dict__["row_copy"]
    with torch.no_grad():
        for rows in range(1, ROW_COPY_MAX_ROWS + 1):
            x = torch.randn(1, rows, 256, dtype=torch.bfloat16)
            assert torch.equal(layer(x), row_copy_product(x, copy_, layer.bias))
        x = torch.randn(ROW_COPY_MAX_ROWS + 1, 256, dtype=torch.bfloat16)
        assert torch.equal(layer(x), blocked_product(x, layer.packed, layer.bias))
        # the copy's product is bf16's up to summation order: within a bf16 rounding or two
        one = torch.randn(1, 256, dtype=torch.bfloat16)
        torch.testing.assert_close(
            layer(one), blocked_product(one, layer.packed, layer.bias), rtol=2e-2, atol=2e-2
        )
    assert add_row_copies(model) == 2  # idempotent: the copies stay the ones made
    assert layer.__dict__["row_copy"] is copy_
    assert "a float16 copy for 1-2 rows" in repr(layer)


def test_a_compiled_steps_operator_takes_the_copy_too():
    model = _model(bias=False)
    add_row_copies(model)
    layer = model[1]
    x = torch.randn(2, 96, dtype=torch.bfloat16)
    with torch.no_grad():
        got = torch.ops.omni.blocked_linear(x, layer.handle, layer.out_features, 0, None)
        want = row_copy_product(x, layer.__dict__["row_copy"], None)
    assert torch.equal(got, want)


def test_a_weight_beyond_float16s_range_keeps_no_copy():
    layer = nn.Linear(8, 4, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight[0, 0] = 70000.0  # float16's largest finite value is 65504
    assert cpu_row_copy.pack_float16(layer.weight) is None
    model = nn.Sequential(BlockedLinear(layer))
    assert add_row_copies(model) == 0


def test_the_stage_call_refuses_what_cannot_run_and_says_when_it_does_nothing(caplog):
    assert apply_row_copies(_model(), False, stage="tts_engine") == 0
    with pytest.raises(ValueError, match=r"stage 'tts_engine': factory\.fp16_row_weights.*float32"):
        apply_row_copies(nn.Linear(4, 4), True, stage="tts_engine")
    dense = nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16))
    with caplog.at_level("WARNING", logger="omni_core.engine.cpu_row_copy"):
        assert apply_row_copies(dense, True, stage="thinker") == 0
    assert "no linear layer here is blocked for oneDNN" in caplog.text
    assert "the setting does nothing here" in caplog.text
    assert apply_row_copies(_model(), True, stage="thinker") == 2
