"""Chat template rendering, tokenisation and media expansion on the tiny preset."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("jinja2")
pytest.importorskip("tokenizers")

import omni_qwen3_omni
from omni_qwen3_omni.audio.mel import audio_token_count
from omni_qwen3_omni.chat import (
    ChatPrompter,
    ChatTemplateError,
    end_of_turn_ids,
    expand_placeholder_ids,
    interleave_video_audio,
    load_chat_template,
)
from omni_qwen3_omni.config import ThinkerConfig
from omni_qwen3_omni.vision.processor import image_token_count

TINY = Path(omni_qwen3_omni.__file__).parent / "presets" / "tiny"
TOOL = Path(__file__).resolve().parents[1] / "tools" / "make_tiny_preset.py"

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
IMG = "<|vision_start|><|image_pad|><|vision_end|>"
AUD = "<|audio_start|><|audio_pad|><|audio_end|>"
IM_START, IM_END, NL = 151644, 151645, 198
USER, SYSTEM_ID, ASSISTANT = 872, 8948, 77091
IMAGE_PAD, AUDIO_PAD, VIDEO_PAD = 151655, 151675, 151656
VISION_START, VISION_END, AUDIO_START, AUDIO_END = 151652, 151653, 151669, 151670


@pytest.fixture(scope="module")
def prompter() -> ChatPrompter:
    return ChatPrompter.from_dir(TINY)


def user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def test_system_and_user_text(prompter):
    got = prompter.render([SYSTEM, {"role": "user", "content": "Hello there."}])
    assert got == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello there.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = prompter.encode([SYSTEM, {"role": "user", "content": "Hello there."}])
    assert ids[:3] == [IM_START, SYSTEM_ID, NL]
    assert ids[-5:] == [IM_END, NL, IM_START, ASSISTANT, NL]
    assert prompter.tokenizer.decode(ids) == got


def test_no_default_system_prompt_and_text_parts_concatenate(prompter):
    got = prompter.render([user(text("Hello"), text(" there."))])
    assert got == "<|im_start|>user\nHello there.<|im_end|>\n<|im_start|>assistant\n"
    assert prompter.encode([user(text("Hi"))])[:3] == [IM_START, USER, NL]


def test_multi_turn_with_an_assistant_reply(prompter):
    messages = [
        SYSTEM,
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": [text("Tell me a joke.")]},
    ]
    assert prompter.render(messages) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
        "<|im_start|>user\nTell me a joke.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_reasoning_is_dropped_from_history_and_kept_after_the_last_query(prompter):
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert prompter.render(history) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )
    last = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "hmm", "content": "Hello!"},
    ]
    assert prompter.render(last, add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nHello!<|im_end|>\n"
    )


def test_thinking_switched_off_appends_an_empty_think_block(prompter):
    got = prompter.render([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert got.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_user_with_image_and_text(prompter):
    messages = [SYSTEM, user({"type": "image"}, text("What is in this picture?"))]
    assert prompter.render(messages) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{IMG}What is in this picture?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_user_with_audio_and_text(prompter):
    messages = [user({"type": "audio"}, text("Transcribe this."))]
    assert prompter.render(messages) == (
        f"<|im_start|>user\n{AUD}Transcribe this.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_two_images_in_place(prompter):
    messages = [user(text("Compare"), {"type": "image"}, text(" and"), {"type": "image"})]
    assert prompter.render(messages) == (
        f"<|im_start|>user\nCompare{IMG} and{IMG}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_expansion_repeats_each_pad_by_its_own_count(prompter):
    messages = [
        user({"type": "image"}, {"type": "audio"}, text("x"), {"type": "image"}),
    ]
    ids = prompter.encode(messages, image_token_counts=[2, 3], audio_token_counts=[4])
    head = [IM_START, USER, NL]
    first = [VISION_START, IMAGE_PAD, IMAGE_PAD, VISION_END]
    audio = [AUDIO_START, *[AUDIO_PAD] * 4, AUDIO_END]
    second = [VISION_START, *[IMAGE_PAD] * 3, VISION_END]
    x = prompter.tokenizer.encode("x")
    assert ids == head + first + audio + x + second + [IM_END, NL, IM_START, ASSISTANT, NL]
    # Text in, ids out: same result.
    assert prompter.expand_placeholders(prompter.render(messages), [2, 3], [4]) == ids


def test_video_expansion_and_audio_in_video_interleaving(prompter):
    ids = prompter.encode([user({"type": "video"}, text("?"))], video_token_counts=[5])
    assert ids.count(VIDEO_PAD) == 5
    # grid (2, 2, 4): 2 tokens per temporal step; 1 s per step at 13 positions per second
    layout = interleave_video_audio((2, 2, 4), 1.0, 13.0, 2, 15)
    assert layout == [True] * 2 + [False] * 13 + [True] * 2 + [False] * 2
    messages = [user({"type": "video"}, {"type": "audio"}, text("?"))]
    ids = prompter.encode(messages, [], [3], [4], video_layouts=[layout])
    start = ids.index(prompter.ids.vision_start)
    assert ids[start + 1] == prompter.ids.audio_start
    kinds = ids[start + 2 : start + 2 + len(layout)]
    assert kinds == [VIDEO_PAD if v else prompter.ids.audio_pad for v in layout]
    assert ids[start + 2 + len(layout) : start + 4 + len(layout)] == [
        prompter.ids.audio_end,
        prompter.ids.vision_end,
    ]
    assert ids.count(prompter.ids.audio_pad) == 15 + 3  # the track's and the audio part's
    with pytest.raises(ValueError, match="layout holding its video count"):
        prompter.encode(messages, [], [3], [5], video_layouts=[layout])


def test_counts_must_match_placeholders(prompter):
    messages = [user({"type": "image"}, {"type": "image"})]
    with pytest.raises(ValueError, match="more placeholders"):
        prompter.encode(messages, image_token_counts=[1])
    with pytest.raises(ValueError, match="3 media counts"):
        prompter.encode(messages, image_token_counts=[1, 1, 1])
    with pytest.raises(ValueError, match=r"placeholder id 151675"):
        prompter.encode(messages, image_token_counts=[1, 1], audio_token_counts=[2])
    assert expand_placeholder_ids([1, 9, 2, 9], {9: [0, 2]}) == [1, 2, 9, 9]


def test_unnormalised_parts_are_rejected(prompter):
    with pytest.raises(ChatTemplateError, match="image_url"):
        prompter.render([user({"type": "image_url", "image_url": {"url": "x"}})])
    with pytest.raises(ChatTemplateError, match="role"):
        prompter.render([{"role": "narrator", "content": "x"}])


def test_special_ids(prompter):
    assert prompter.eos_token_ids == (IM_END, 151643)
    assert (prompter.ids.image_pad, prompter.ids.audio_pad, prompter.ids.video_pad) == (
        IMAGE_PAD,
        AUDIO_PAD,
        VIDEO_PAD,
    )
    for word, expected in (("user", USER), ("system", SYSTEM_ID), ("assistant", ASSISTANT)):
        assert prompter.tokenizer.encode(word) == [expected]


def test_media_token_counts():
    # 100 mel frames -> 13 tokens; a partial chunk -> ceil(frames / 8).
    assert [audio_token_count(n) for n in (0, 1, 8, 9, 100, 200, 230, 3000)] == [
        0,
        1,
        1,
        2,
        13,
        26,
        30,
        390,
    ]
    assert image_token_count((1, 4, 6)) == 6
    assert image_token_count((2, 8, 4), merge_size=2) == 16
    with pytest.raises(ValueError):
        image_token_count((1, 3, 4))


def test_template_lookup_order(tmp_path):
    shutil.copytree(TINY, tmp_path / "ckpt")
    root = tmp_path / "ckpt"
    (root / "chat_template.jinja").write_text("JINJA")
    assert (
        load_chat_template(root)
        == json.loads((TINY / "chat_template.json").read_text())["chat_template"]
    )
    (root / "chat_template.json").unlink()
    assert load_chat_template(root) == "JINJA"
    (root / "chat_template.jinja").unlink()
    config = json.loads((root / "tokenizer_config.json").read_text())
    assert load_chat_template(root) == config["chat_template"]
    config.pop("chat_template")
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatPrompter.from_dir(root)


def test_preset_ids_agree_with_the_config_and_the_generator(prompter, tmp_path):
    config = json.loads((TINY / "config.json").read_text())
    thinker = ThinkerConfig.from_dict(config)
    assert thinker.image_token_id == prompter.ids.image_pad
    assert thinker.audio_token_id == prompter.ids.audio_pad
    assert thinker.video_token_id == prompter.ids.video_pad
    assert thinker.audio_start_token_id == prompter.ids.audio_start
    assert thinker.vision_start_token_id == prompter.ids.vision_start
    assert thinker.user_token_id == USER
    assert config["im_start_token_id"] == prompter.ids.im_start
    assert config["im_end_token_id"] == prompter.ids.im_end
    assert thinker.text.vocab_size >= 151676
    # The committed preset is what the generator writes.
    spec = importlib.util.spec_from_file_location("make_tiny_preset", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.OUT = tmp_path / "tiny"
    tool.main()
    for path in sorted(TINY.iterdir()):
        assert (tmp_path / "tiny" / path.name).read_bytes() == path.read_bytes(), path.name


def test_the_end_of_turn_ids_come_from_the_config_without_the_vocabulary(
    prompter, tmp_path, monkeypatch
):
    """The thinker's stop ids, read from tokenizer_config.json alone; a config without
    the two tokens falls back to the whole tokenizer, with the same answer."""
    from omni_qwen3_omni import chat

    reads = []
    real = chat.TextTokenizer.from_dir
    monkeypatch.setattr(chat.TextTokenizer, "from_dir", lambda p: reads.append(p) or real(p))
    assert end_of_turn_ids(TINY) == prompter.eos_token_ids == (IM_END, 151643)
    assert reads == []
    bare = tmp_path / "bare"  # a checkpoint with tokenizer.json and no tokenizer_config
    shutil.copytree(TINY, bare)
    prompter.tokenizer._tok.save(str(bare / "tokenizer.json"))
    (bare / "tokenizer_config.json").unlink()
    assert end_of_turn_ids(bare) == prompter.eos_token_ids
    assert reads == [bare]
