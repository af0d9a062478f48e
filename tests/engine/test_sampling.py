"""The batched sampler: distributions, filters, determinism, and batched == alone."""

from __future__ import annotations

import math

import pytest
import torch

from omni_core.engine.interface import SamplingParams
from omni_core.engine.sampling import apply_repetition_penalty, make_generator, sample

PROBS = torch.tensor([0.5, 0.3, 0.2])


def _counts(params: SamplingParams, logits: torch.Tensor, draws: int = 3000) -> torch.Tensor:
    generator = make_generator(7)
    batch = logits.expand(draws, -1)
    tokens = sample(batch, [params] * draws, [generator] * draws)
    return torch.bincount(tokens, minlength=logits.shape[-1]).float() / draws


def test_plain_sampling_follows_the_softmax() -> None:
    freq = _counts(SamplingParams(temperature=1.0), PROBS.log())
    assert torch.allclose(freq, PROBS, atol=0.04), freq


def test_temperature_sharpens_and_flattens() -> None:
    cold = _counts(SamplingParams(temperature=0.1), PROBS.log())
    hot = _counts(SamplingParams(temperature=10.0), PROBS.log())
    assert cold[0] > 0.95
    assert torch.allclose(hot, torch.full((3,), 1 / 3), atol=0.05), hot


def test_greedy_takes_the_argmax_and_draws_no_random_number() -> None:
    generator = make_generator(3)
    state = generator.get_state()
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 4.9]])
    tokens = sample(logits, [SamplingParams(temperature=0.0)] * 2, [generator] * 2)
    assert tokens.tolist() == [1, 0]
    assert torch.equal(generator.get_state(), state)


@pytest.mark.parametrize(
    ("top_p", "allowed"), [(0.4, {0}), (0.5, {0}), (0.6, {0, 1}), (1.0, {0, 1, 2})]
)
def test_top_p_keeps_the_smallest_set_that_reaches_p(top_p: float, allowed: set[int]) -> None:
    freq = _counts(SamplingParams(top_p=top_p), PROBS.log(), draws=1500)
    assert {i for i, f in enumerate(freq.tolist()) if f > 0} == allowed


def test_top_k_keeps_the_k_best_renormalised() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0, -1.0])
    freq = _counts(SamplingParams(top_k=2), logits)
    assert {i for i, f in enumerate(freq.tolist()) if f > 0} == {1, 3}
    expected = math.exp(3) / (math.exp(3) + math.exp(2))
    assert abs(freq[1].item() - expected) < 0.04


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0], [2.0, -2.0, 1.0]])
    apply_repetition_penalty(logits, [2.0, 1.0], [[0, 1, 1], [0, 1]])
    assert logits.tolist() == [[1.0, -4.0, 1.0], [2.0, -2.0, 1.0]]


def test_repetition_penalty_lowers_the_chance_of_a_repeat() -> None:
    rows = 2000
    logits = torch.ones(rows, 4)
    generator = make_generator(1)
    params = SamplingParams(repetition_penalty=5.0)
    tokens = sample(
        logits,
        [params] * rows,
        [generator] * rows,
        previous=[[0]] * rows,
    )
    share = (tokens == 0).float().mean().item()
    assert share < 0.15  # e^(1/5) vs 3 e^1 against 1/4 without a penalty
    assert torch.equal(logits, torch.ones(rows, 4))  # the caller's logits are left alone


def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(top_p=0.9)]

    def run(seed: int) -> list[int]:
        generator = make_generator(seed)
        return [sample(logits, params, [generator]).item() for _ in range(30)]

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_a_row_samples_the_same_alone_and_batched() -> None:
    """Per-row parameters and generators: batching must not change any row's draws."""
    vocab, steps = 300, 25
    rows = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, seed=1),
        SamplingParams(temperature=0.7, top_k=20, seed=2),
        SamplingParams(temperature=1.3, top_p=0.8, seed=3),
        SamplingParams(temperature=0.9, top_k=50, top_p=0.9, repetition_penalty=1.3, seed=4),
        SamplingParams(temperature=1.0, repetition_penalty=1.1, seed=5),
    ]
    noise = torch.Generator().manual_seed(9)
    logits = [torch.randn(len(rows), vocab, generator=noise) for _ in range(steps)]

    def run(indices: list[int]) -> list[list[int]]:
        generators = [make_generator(rows[i].seed) for i in indices]
        history: list[list[int]] = [[] for _ in indices]
        for step in logits:
            tokens = sample(step[indices], [rows[i] for i in indices], generators, history)
            for row, token in enumerate(tokens.tolist()):
                history[row].append(token)
        return history

    batched = run(list(range(len(rows))))
    alone = [run([i])[0] for i in range(len(rows))]
    assert batched == alone
    assert len({tuple(h) for h in batched}) == len(rows)


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match="logits"):
        sample(torch.zeros(2, 3), [SamplingParams()], [None])


def test_top_k_rows_draw_from_topk_what_a_full_sort_gave(monkeypatch) -> None:
    """With a top-k on every row only the best few are ranked (``topk``, not a sort of the
    whole vocabulary), and every draw is the one the full stable sort gave, ties included."""
    import omni_core.engine.sampling as sampling

    vocab = 4000
    noise = torch.Generator().manual_seed(3)
    logits = torch.randn(6, vocab, generator=noise)
    logits[1, 100:140] = 5.0  # a tie across row 1's top-k boundary: the full sort decides
    logits[2, ::2] = float("-inf")
    logits[3] = logits[3].round()  # many ties inside the top-k, ordered by id
    rows = [
        SamplingParams(temperature=1.0, top_k=k, top_p=p, seed=s)
        for s, (k, p) in enumerate([(20, 1.0), (25, 0.9), (50, 0.8), (40, 1.0), (1, 1.0), (7, 0.5)])
    ]

    def draws() -> list[list[int]]:
        generators = [make_generator(r.seed) for r in rows]
        return [sample(logits, rows, generators).tolist() for _ in range(30)]

    with torch.profiler.profile() as profile:
        fast = draws()
    assert "aten::topk" in {e.key for e in profile.key_averages()}
    with monkeypatch.context() as patch:
        patch.setattr(sampling, "_candidates", _full_sort)
        full = draws()
    assert fast == full
    # alone, row 0 ranks its best few only; row 1's boundary tie sorts its whole row
    assert _sorted_widths(logits[0:1], rows[0]) == [21]
    assert _sorted_widths(logits[1:2], rows[1]) == [vocab]
    # batched, row 1's tie sorts row 1 whole, not every row of the batch
    assert _whole_sorts(logits, rows) == [[1, vocab]]


def _whole_sorts(logits: torch.Tensor, params: list[SamplingParams]) -> list[list[int]]:
    """The shapes of the sorts ``sample`` ran over whole rows of the vocabulary."""
    generators = [make_generator(p.seed) for p in params]
    with torch.profiler.profile(record_shapes=True) as profile:
        sample(logits, params, generators)
    vocab = logits.shape[-1]
    return [
        list(event.input_shapes[0])
        for event in profile.events()
        if event.name == "aten::sort"
        and event.input_shapes
        and event.input_shapes[0][-1:] == [vocab]
    ]


def _sorted_widths(logits: torch.Tensor, params: SamplingParams) -> list[int]:
    """The row length of the last sort ``sample`` ran: the best-first ranking."""
    with torch.profiler.profile(record_shapes=True) as profile:
        sample(logits, [params], [make_generator(0)])
    return [
        event.input_shapes[0][-1]
        for event in profile.events()
        if event.name == "aten::sort" and event.input_shapes and event.input_shapes[0]
    ][-1:]


def _full_sort(logits: torch.Tensor, top_k: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.sort(logits, dim=-1, descending=True, stable=True)


def test_a_mixed_batch_never_reads_the_device_from_the_host() -> None:
    # On the meta device every read of a value (``.item()``, ``bool()``, a list index's
    # copy that waits for the stream) raises: on a GPU each would wait for the device.
    params = [
        SamplingParams(temperature=0, repetition_penalty=1.2),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1),
    ]
    logits = torch.empty(3, 500, device="meta")
    previous = [[1, 2], [], torch.tensor([3, 4])]
    out = sample(logits, params, [None] * 3, previous)
    assert out.shape == (3,) and out.dtype == torch.long and out.device.type == "meta"


def test_rows_that_share_a_generator_draw_together_in_row_order() -> None:
    from omni_core.engine.sampling import uniforms

    a, b, c = make_generator(1), make_generator(2), make_generator(3)
    drawn = uniforms([a, b, a, None, b, a, c], torch.device("cpu"))
    want_a = torch.rand(3, generator=make_generator(1))
    want_b = torch.rand(2, generator=make_generator(2))
    assert torch.equal(drawn[[0, 2, 5]], want_a) and torch.equal(drawn[[1, 4]], want_b)
    assert drawn[6] == torch.rand((), generator=make_generator(3))  # one row: one number
    assert 0 <= float(drawn[3]) < 1  # the default generator's
