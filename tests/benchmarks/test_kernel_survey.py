"""``benchmarks/bench_cpu_kernel_survey.py``: the candidate kernels compute what they claim.

The survey's times only mean something if each kernel is the product it is
named for: W8A8 rows quantised one by one (so a batch answers as each row
alone), oneDNN's int8 call equal to the same integer arithmetic done in
float64, and the float16-packed weights as exact as bf16's. No timing here.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

SURVEY = "bench_cpu_kernel_survey.py"


@pytest.fixture(scope="module")
def survey(load_script) -> ModuleType:
    with load_script(SURVEY) as module:
        yield module


def weight_and_rows(rows: int = 5, k: int = 256, n: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    weight = (torch.randn(n, k, generator=generator) * 0.05).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=generator)
    x[1] *= 40.0  # rows of very different sizes: a shared scale would squash the others
    return weight, x.to(torch.bfloat16)


@pytest.mark.parametrize("kind", ["fbgemm", "onednn"])
def test_w8a8_rows_answer_as_if_each_came_alone(survey, kind) -> None:
    available = survey.fbgemm_available() if kind == "fbgemm" else survey.onednn_int8_available()
    if not available:
        pytest.skip(f"this torch build has no {kind} int8 linear kernel")
    weight, x = weight_and_rows()
    make = survey.fbgemm_w8a8_kernel if kind == "fbgemm" else survey.onednn_w8a8_kernel
    kernel = make(weight)
    together = kernel(x)
    alone = torch.cat([kernel(x[i : i + 1]) for i in range(x.shape[0])])
    assert torch.equal(together, alone)
    # and it is a product: within a few percent of the exact one (int8 on both sides)
    assert survey.relative_error(kernel, weight, x) < 0.05


def test_onednn_w8a8_is_the_integer_product_it_stands_for(survey) -> None:
    if not survey.onednn_int8_available():
        pytest.skip("this torch build has no oneDNN int8 linear kernel")
    weight, x = weight_and_rows()
    q, scales = survey.int8_per_channel(weight)
    unit, row_scale = survey.rows_to_unit(x)
    xq = torch.round(unit * 127.0)
    expected = (xq.double() @ q.double().t()) * scales.double() * (row_scale.double() / 127.0)
    got = survey.onednn_w8a8_kernel(weight)(x).double()
    # the kernel rounds its float32 output to bf16 at the end, as the survey's inputs are
    assert torch.allclose(got, expected.to(torch.bfloat16).double(), rtol=1e-2, atol=1e-3)
    assert not torch.allclose(got, x.double() @ weight.double().t(), rtol=1e-4, atol=1e-6)


def test_the_float16_packed_weight_is_as_exact_as_bf16s(survey) -> None:
    if not survey.fbgemm_available():
        pytest.skip("this torch build has no fbgemm")
    weight, x = weight_and_rows()
    half = survey.relative_error(survey.fp16_kernel(weight), weight, x)
    bf16 = survey.relative_error(lambda rows: rows @ weight.t(), weight, x)
    assert half <= 1.5 * bf16  # both only round the output to bf16
    int8 = survey.relative_error(survey.kernels(weight)["int8 weight-only"][0], weight, x)
    assert half < int8
