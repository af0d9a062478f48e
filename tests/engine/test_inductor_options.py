"""The compiled steps' inductor options: no per-call checks in the wrapper, unless asked."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.inductor_options import CHECKS, step_options  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")


def test_every_check_is_off_where_no_variable_says_otherwise():
    assert step_options({}) == {
        "size_asserts": False,
        "alignment_asserts": False,
        "scalar_asserts": False,
    }


def test_a_check_whose_variable_is_set_is_left_to_inductor_and_more_options_join():
    options = step_options({"TORCHINDUCTOR_SIZE_ASSERTS": "1"}, max_autotune=True)
    assert options == {"alignment_asserts": False, "scalar_asserts": False, "max_autotune": True}


def test_each_check_is_an_inductor_option_read_from_the_variable_named():
    import inspect

    import torch._inductor.config as inductor_config

    source = inspect.getsource(inductor_config)
    for option, variable in CHECKS.items():
        assert isinstance(getattr(inductor_config, option), bool)
        assert f'"{variable}"' in source  # the variable inductor itself reads for it


def _product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w) + 1  # an extern kernel (mm) whose output inductor checks


def test_a_step_compiled_with_them_has_no_checks_in_its_wrapper_and_equals_eager():
    from torch._inductor.utils import run_and_get_code

    x, w = torch.randn(3, 16), torch.randn(16, 8)
    checked = torch.compile(_product, dynamic=False)
    lean = torch.compile(_product, dynamic=False, options=step_options({}))
    _, (checked_code, *_) = run_and_get_code(checked, x, w)
    out, (lean_code, *_) = run_and_get_code(lean, x, w)
    assert "assert_size_stride(" in checked_code  # a call: what the options remove
    assert "assert_size_stride(" not in lean_code
    assert "assert_alignment(" not in lean_code
    torch.testing.assert_close(out, _product(x, w))
