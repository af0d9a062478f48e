"""omni_core.kit.config: a release's JSON into a frozen dataclass; extra keys and nulls left."""

from __future__ import annotations

from dataclasses import dataclass

from omni_core.kit.config import FromDict, known_fields


@dataclass(frozen=True)
class Sampling(FromDict):
    top_k: int = 50
    temperature: float = 0.9
    nested: dict | None = None


def test_known_non_null_keys_are_read_and_the_rest_keep_their_defaults():
    raw = {"top_k": 5, "temperature": None, "transformers_version": "4.57", "model_type": "x"}
    assert Sampling.from_dict(raw) == Sampling(top_k=5)
    assert known_fields(Sampling, raw) == {"top_k": 5}


def test_aliases_fill_a_field_only_when_its_own_spelling_is_absent_and_exclude_skips():
    assert known_fields(Sampling, {"k": 3}, {"k": "top_k"}) == {"top_k": 3}
    assert known_fields(Sampling, {"k": 3, "top_k": 4}, {"k": "top_k"}) == {"top_k": 4}
    assert known_fields(Sampling, {"nested": {}, "top_k": 1}, exclude={"nested"}) == {"top_k": 1}


def test_rotary_settings_are_read_under_either_spelling():
    from omni_core.kit.config import rope_theta, rope_type

    assert rope_theta({"rope_theta": 5e5}, 1e4) == 5e5
    assert rope_theta({"rope_parameters": {"rope_theta": 2e6, "rope_type": "default"}}, 1e4) == 2e6
    assert rope_theta({}, 1e4) == 1e4
    assert rope_type({"rope_scaling": {"type": "mrope"}}) == "mrope"
    assert rope_type({"rope_parameters": {"rope_type": "yarn"}}) == "yarn"
    assert rope_type({}) == "default"


def test_the_qwen_special_ids_are_keyword_only_defaults_read_from_non_null_keys():
    from omni_core.kit.config import ChatTokenIds, TTSTextIds, token_ids

    @dataclass(frozen=True)
    class Root(TTSTextIds):
        variant: str  # a family's own positional field, declared after the inherited ids

    root = Root("base", tts_pad_token_id=7)
    assert (root.im_start_token_id, root.im_end_token_id) == (151644, 151645)
    assert (root.tts_pad_token_id, root.tts_bos_token_id, root.tts_eos_token_id) == (
        7,
        151672,
        151673,
    )
    raw = {"im_start_token_id": "3", "im_end_token_id": None, "tts_pad_token_id": 9, "x": 1}
    assert token_ids(ChatTokenIds, raw) == {"im_start_token_id": 3}
    assert token_ids(TTSTextIds, raw) == {"im_start_token_id": 3, "tts_pad_token_id": 9}
