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
    assert "'ref_text' takes 4 tokens" in str(caught.value)
    assert "at most 3 tokens (f.max)" in str(caught.value)


def test_a_text_far_beyond_any_tokenizer_is_refused_without_tokenizing():
    def never(text: str) -> list[int]:
        raise AssertionError("tokenized")

    text = "x" * (CHARS_PER_TOKEN_BOUND * 10 + 1)
    with pytest.raises(RequestError, match="characters, more than 10 tokens can hold"):
        check_text_tokens(never, {"input": text}, ("input",), 10, "s")
