"""A masked prompt's attention keeps off the score-writing kernel where torch's own do not
take grouped heads: the decision and the equal result, on the CPU (the memory, on CUDA:
tests/cuda/test_prompt_attention_on_cuda.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from omni_core.engine.cuda_attention import (  # noqa: E402
    grouped_prompt_inputs,
    kernel_takes_grouped_heads,
    repeats_pay,
)


def _inputs(rows: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, rows, 16, generator=gen, dtype=dtype)
    k = torch.randn(2, 2, rows, 16, generator=gen, dtype=dtype)
    v = torch.randn(2, 2, rows, 16, generator=gen, dtype=dtype)
    mask = torch.ones(rows, rows, dtype=torch.bool).tril()[None, None].repeat(2, 1, 1, 1)
    mask[1, :, :, :3] = False  # the second row's prompt starts later
    mask[1, :, :3, 0] = True  # (every query sees a key)
    return q, k, v, mask


def test_without_a_kernel_for_grouped_heads_the_heads_are_repeated_to_the_same_result():
    q, k, v, mask = _inputs(40)
    asked = []
    keys, values, grouped = grouped_prompt_inputs(
        q, k, v, mask, takes=lambda *a: asked.append(a) or False
    )
    assert asked and not grouped and keys.shape[1] == values.shape[1] == 8
    repeated = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(repeated, expected)


def test_a_kernel_that_takes_grouped_heads_gets_them_as_they_are():
    q, k, v, mask = _inputs(40)
    keys, values, grouped = grouped_prompt_inputs(q, k, v, mask, takes=lambda *a: True)
    assert grouped and keys is k and values is v


def test_decode_steps_and_unmasked_or_ungrouped_calls_are_left_alone():
    def never(*args):
        raise AssertionError("asked")

    q, k, v, mask = _inputs(40)
    step = q[:, :, -1:]  # one row each: the scores are smaller than the repeat
    assert grouped_prompt_inputs(step, k, v, mask[:, :, -1:], takes=never) == (k, v, True)
    assert grouped_prompt_inputs(q, k, v, None, takes=never) == (k, v, True)
    wide = k.repeat_interleave(4, dim=1)
    assert grouped_prompt_inputs(q, wide, wide, mask, takes=never) == (wide, wide, False)


def test_repeating_pays_from_the_rows_whose_scores_outweigh_the_keys():
    # bf16, head dim 128: a repeated head's keys and values (2 x 128 x 2 bytes a key)
    # against the rows' float32 scores (4 bytes a key a row)
    assert not repeats_pay(torch.empty(1, 32, 64, 128, dtype=torch.bfloat16))
    assert repeats_pay(torch.empty(1, 32, 65, 128, dtype=torch.bfloat16))
    assert repeats_pay(torch.empty(1, 32, 129, 128))  # float32: from 129 rows
    assert not repeats_pay(torch.empty(1, 32, 128, 128))


def test_torch_is_asked_once_per_layout_and_says_no_off_cuda():
    from omni_core.engine import cuda_attention

    q, k, v, mask = _inputs(8)
    assert kernel_takes_grouped_heads(q, k, v, mask) is False  # no CUDA kernel takes these
    key = (q.device, q.dtype, 8, 2, 16, torch.bool)
    assert cuda_attention._DECIDED[key] is False
    cuda_attention._DECIDED[key] = True  # the answer kept is the answer given
    try:
        assert kernel_takes_grouped_heads(q, k, v, mask) is True
    finally:
        del cuda_attention._DECIDED[key]
