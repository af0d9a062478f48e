"""EmbeddedPrompt: a prompt with embedding rows and per-layer additions, checked on build."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.prompt import EmbeddedPrompt, splice_embeddings  # noqa: E402


def test_splice_puts_each_row_at_its_index_and_leaves_the_rest():
    tokens = torch.zeros(5, 3)
    rows = torch.tensor([[1.0, 1, 1], [2.0, 2, 2]])
    prompt = EmbeddedPrompt([7] * 5, embeddings=rows, embedding_index=torch.tensor([3, 1]))
    out = splice_embeddings(tokens, prompt)
    assert out[3].tolist() == [1.0, 1, 1] and out[1].tolist() == [2.0, 2, 2]
    assert out[[0, 2, 4]].abs().sum() == 0
    assert tokens.abs().sum() == 0  # a copy: the token embeddings are untouched
    assert prompt.first_decode_position == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embeddings": torch.zeros(2, 3)}, "come together"),
        (
            {"embeddings": torch.zeros(2, 3), "embedding_index": torch.tensor([0, 9])},
            "outside the prompt",
        ),
        (
            {"embeddings": torch.zeros(1, 3), "embedding_index": torch.tensor([0, 1])},
            "one \\[n, H\\] row per index",
        ),
        ({"layer_additions": [torch.zeros(1, 3)]}, "need addition_index"),
        ({"positions": torch.zeros(3, 4, dtype=torch.long)}, "do not cover"),
    ],
)
def test_inconsistent_prompts_are_refused_when_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EmbeddedPrompt([1, 2, 3], **kwargs)


def test_decoding_continues_from_the_rope_delta_position():
    prompt = EmbeddedPrompt(
        [1, 2, 3], positions=torch.zeros(3, 3, dtype=torch.long), next_position=2
    )
    assert len(prompt) == 3 and prompt.first_decode_position == 2
