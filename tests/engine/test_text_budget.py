"""A stage's token budget for text fields: counted with the tokenizer, refused naming it."""

from __future__ import annotations

import pytest

from omni_core.engine.text_budget import CHARS_PER_TOKEN_BOUND, check_text_tokens
from omni_core.errors import RequestError


def words(text: str) -> list[int]:
    return list(range(len(text.split())))


def test_fields_within_the_budget_pass_and_others_are_ignored():
    check_text_tokens(words, {"input": "a b c", "voice": "x " * 99}, ("input",), 3, "s")
    check_text_tokens(words, {"input": None, "other": 3}, ("input", "ref_text"), 3, "s")


def test_a_field_over_the_budget_is_a_request_error_naming_field_count_and_setting():
    with pytest.raises(RequestError) as caught:
        check_text_tokens(words, {"ref_text": "a b c d"}, ("input", "ref_text"), 3, "f.max")
    assert "'ref_text' takes 4 tokens; this server takes at most 3 (f.max)" in str(caught.value)


def test_a_text_far_beyond_any_tokenizer_is_refused_without_tokenizing():
    def never(text: str) -> list[int]:
        raise AssertionError("tokenized")

    text = "x" * (CHARS_PER_TOKEN_BOUND * 10 + 1)
    with pytest.raises(RequestError, match="characters: more than 10 tokens"):
        check_text_tokens(never, {"input": text}, ("input",), 10, "s")


def test_a_long_text_is_counted_in_slices_and_the_count_stops_past_the_limit():
    from omni_core.engine.text_budget import SLICE_CHARS, slices

    calls: list[int] = []

    def counting(text: str) -> list[int]:
        calls.append(len(text))
        return words(text)

    text = "word " * (SLICE_CHARS * 3)  # 15 slices' worth, 24576 words
    assert "".join(slices(text, SLICE_CHARS)) == text
    assert all(len(piece) <= SLICE_CHARS for piece in slices(text, SLICE_CHARS))
    check_text_tokens(counting, {"input": text}, ("input",), 30000, "s")
    assert max(calls) <= SLICE_CHARS and sum(calls) == len(text)  # never all at once
    calls.clear()
    with pytest.raises(RequestError, match="'input' takes over 2000 tokens"):
        check_text_tokens(counting, {"input": text}, ("input",), 2000, "s")
    assert sum(calls) < 2 * 2000 * len("word ")  # stopped soon after the limit
