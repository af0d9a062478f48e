"""The release's prompt, the answer's language header, the languages, the config."""

from __future__ import annotations

import json

import pytest

from omni_qwen3_asr.config import ASRConfig
from omni_qwen3_asr.languages import canonical
from omni_qwen3_asr.prompt import AnswerParser, prompt_ids
from omni_qwen3_asr.source import resolve_model_path
from omni_qwen3_omni.chat import ChatPrompter
from omni_qwen3_omni.config import ConfigError

ROOT = resolve_model_path("tiny").path


@pytest.fixture(scope="module")
def prompter() -> ChatPrompter:
    return ChatPrompter.from_dir(ROOT)


def _config() -> dict:
    return json.loads((ROOT / "config.json").read_text())


def test_the_prompt_is_context_as_system_turn_then_the_clip(prompter) -> None:
    ids = prompt_ids(prompter, "Kubernetes, Grafana", 7, None)
    text = prompter.tokenizer.decode(ids)
    pads = "<|audio_pad|>" * 7
    assert text == (
        "<|im_start|>system\nKubernetes, Grafana<|im_end|>\n"
        f"<|im_start|>user\n<|audio_start|>{pads}<|audio_end|><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert ids.count(ASRConfig.from_dict(_config()).audio_token_id) == 7


def test_no_context_keeps_an_empty_system_turn_and_a_forced_language_opens_the_answer(
    prompter,
) -> None:
    text = prompter.tokenizer.decode(prompt_ids(prompter, "", 2, "German"))
    assert text.startswith("<|im_start|>system\n<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\nlanguage German<asr_text>")


def test_the_header_is_read_off_a_streamed_answer() -> None:
    parser = AnswerParser()
    pieces = ["lang", "uage Eng", "lish<asr", "_text>Hello", " there"]
    assert "".join(parser.feed(p) for p in pieces) + parser.flush() == "Hello there"
    assert parser.language == "English"


def test_an_answer_without_a_header_is_all_transcript() -> None:
    parser = AnswerParser()
    assert parser.feed("Hello") == "Hello" and parser.feed(" world") == " world"
    assert parser.language is None
    unfinished = AnswerParser()
    assert unfinished.feed("language Fre") == ""
    assert unfinished.flush() == "language Fre"  # never closed: the release keeps it as text


def test_a_forced_language_makes_everything_transcript_and_none_means_no_speech() -> None:
    forced = AnswerParser(forced="French")
    assert forced.feed("language is") == "language is" and forced.language == "French"
    silent = AnswerParser()
    assert silent.feed("language None<asr_text>") == "" and silent.language is None


def test_languages_take_codes_and_names_and_refuse_the_rest() -> None:
    assert canonical("en") == "English" and canonical("cHINese") == "Chinese"
    assert canonical("de", ("English", "German")) == "German"
    with pytest.raises(ValueError, match=r"Klingon.*ISO-639-1"):
        canonical("Klingon")
    with pytest.raises(ValueError, match=r"'fr'.*English, German$"):
        canonical("fr", ("English", "German"))


def test_the_decoder_is_dense_and_the_widths_must_meet() -> None:
    config = ASRConfig.from_dict(_config())
    assert config.text.num_experts == 0 and not config.text.is_moe_layer(0)
    assert config.text.rope_theta == 5_000_000.0
    assert config.audio_token_id == 151676 and "English" in config.support_languages
    raw = _config()
    del raw["thinker_config"]["text_config"]["rope_theta"]
    assert ASRConfig.from_dict(raw).text.rope_theta == 5_000_000.0  # the release's default
    raw["thinker_config"]["audio_config"]["output_dim"] = 48
    with pytest.raises(ConfigError, match=r"output_dim \(48\) must equal.*hidden_size \(32\)"):
        ASRConfig.from_dict(raw)
