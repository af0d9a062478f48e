"""Prompts of CustomVoice, VoiceDesign and Base, and their embedding layout."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")

from omni_qwen3_tts.model import Qwen3TTSModel  # noqa: E402
from omni_qwen3_tts.prompt import PromptError, assistant_text  # noqa: E402
from omni_qwen3_tts.weights import PRESETS_DIR  # noqa: E402


@pytest.fixture(scope="module")
def design_model(tmp_path_factory) -> Qwen3TTSModel:
    root = tmp_path_factory.mktemp("design") / "ckpt"
    shutil.copytree(PRESETS_DIR / "tiny", root)
    config = json.loads((root / "config.json").read_text())
    config["tts_model_type"] = "voice_design"
    (root / "config.json").write_text(json.dumps(config))
    return Qwen3TTSModel.from_pretrained(root, load_format="dummy")


def test_framing_tokens(tiny_model):
    tok = tiny_model.tokenizer
    ids = tok.encode(assistant_text("Hello the world"))
    cfg = tiny_model.config
    assert ids[0] == cfg.im_start_token_id and tok.decode(ids[1:3]) == "assistant\n"
    assert ids[-5] == cfg.im_end_token_id and ids[-3] == cfg.im_start_token_id
    assert tok.decode(ids[3:-5]) == "Hello the world"


def test_custom_voice_prompt(tiny_model):
    prompts = tiny_model.prompts
    p = prompts.custom_voice("Hello", "Serena", "English")
    talker = tiny_model.config.talker
    assert p.speaker_id == talker.spk_id["serena"]
    assert p.language_id == talker.codec_language_id["english"]
    assert p.non_streaming is True
    assert prompts.custom_voice("Hello", "ryan", "auto").language_id is None
    # A dialect speaker speaking Chinese (or auto) switches to the dialect's language id.
    assert prompts.custom_voice("Hello", "eric", "auto").language_id == 82
    assert prompts.custom_voice("Hello", "eric", "english").language_id == 80


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"text": "Hi", "speaker": "nobody"},
            "unknown voice 'nobody'; supported: eric, ryan, serena",
        ),
        ({"text": "Hi", "speaker": "ryan", "language": "klingon"}, "unknown language 'klingon'"),
        ({"text": "Hi", "speaker": "ryan", "language": "sichuan_dialect"}, "unknown language"),
        ({"text": "   ", "speaker": "ryan"}, "text is empty"),
    ],
)
def test_custom_voice_errors(tiny_model, kwargs, message):
    with pytest.raises(PromptError, match=message):
        tiny_model.prompts.custom_voice(**kwargs)


def test_variant_mismatch(tiny_model):
    with pytest.raises(PromptError, match="'custom_voice' model"):
        tiny_model.prompts.voice_design("Hi", "A calm voice")


def test_streaming_custom_voice_layout(tiny_model):
    """Row by row, the release's layout: role, codec prefix + tts_pad/bos, first text token."""
    m = tiny_model
    p = m.prompts.custom_voice("Hello the world", "serena", "english", non_streaming=False)
    prefill, trailing = m.embed_prompt(p)
    t, cfg, tc = m.talker, m.config, m.config.talker

    def text(*ids):
        return t.embed_text(torch.tensor(ids))

    def codec(*ids):
        return t.embed_codec(torch.tensor(ids))

    pad, bos, eos = (
        text(cfg.tts_pad_token_id)[0],
        text(cfg.tts_bos_token_id)[0],
        text(cfg.tts_eos_token_id)[0],
    )
    ids = p.text_ids
    expected = torch.cat(
        [
            text(*ids[:3]),
            pad
            + codec(tc.codec_think_id, tc.codec_think_bos_id, p.language_id, tc.codec_think_eos_id),
            pad + codec(tc.spk_id["serena"]),
            bos + codec(tc.codec_pad_id),
            text(ids[3]) + codec(tc.codec_bos_id),
        ]
    )
    assert prefill.shape == expected.shape
    torch.testing.assert_close(prefill, expected)
    torch.testing.assert_close(trailing, torch.cat([text(*ids[4:-5]), eos[None]]))
    assert m.prompt_length(p) == prefill.shape[0]


def test_non_streaming_custom_voice_puts_all_text_in_prefill(tiny_model):
    m = tiny_model
    p = m.prompts.custom_voice("Hello the world", "serena", "auto", non_streaming=True)
    prefill, trailing = m.embed_prompt(p)
    body = len(p.text_ids) - 8
    # role 3 + (nothink, think_bos, think_eos, speaker, pad) + body + eos + final bos
    assert prefill.shape[0] == 3 + 5 + body + 1 + 1 == m.prompt_length(p)
    pad = m.talker.embed_text(torch.tensor([m.config.tts_pad_token_id]))
    torch.testing.assert_close(trailing, pad)


def test_voice_design_instruction_comes_first(design_model):
    m = design_model
    p = m.prompts.voice_design("Hello", "A deep calm voice", "english")
    assert p.speaker_id is None and p.instruct_ids is not None
    prefill, _ = m.embed_prompt(p)
    torch.testing.assert_close(
        prefill[: len(p.instruct_ids)], m.talker.embed_text(torch.tensor(p.instruct_ids))
    )
    assert prefill.shape[0] == m.prompt_length(p)
    assert m.generate(p, 3).shape[1] == 16


def test_voice_clone_prompts(base_model):
    m = base_model
    xvec = torch.randn(m.config.talker.transformer.hidden_size)
    ref = torch.randint(0, 64, (4, 16))
    only = m.prompts.voice_clone("Hello", xvec, "english", x_vector_only=True)
    assert only.ref_codes is None and not only.icl
    for prompt in (
        only,
        m.prompts.voice_clone("Hello", xvec, "english", ref, "the world", non_streaming=False),
        m.prompts.voice_clone("Hello the world " * 3, xvec, "auto", ref, "he", non_streaming=False),
        m.prompts.voice_clone("Hello", xvec, "english", ref, "the world", non_streaming=True),
    ):
        prefill, trailing = m.embed_prompt(prompt)
        assert prefill.shape[0] == m.prompt_length(prompt)
        assert trailing.shape[0] >= 1
    with pytest.raises(PromptError, match="transcript"):
        m.prompts.voice_clone("Hello", xvec, "english", ref, "")


def test_voice_clone_icl_block(base_model):
    """Streaming ICL: (ref text + text + eos) over (codec bos + reference frames), rest trails."""
    m = base_model
    xvec = torch.randn(m.config.talker.transformer.hidden_size)
    ref = torch.randint(0, 64, (2, 16))
    p = m.prompts.voice_clone("Hello the world", xvec, "english", ref, "the", non_streaming=False)
    prefill, trailing = m.embed_prompt(p)
    t = m.talker
    text_ids = p.ref_text_ids[3:-2] + p.text_ids[3:-5]
    eos = t.embed_text(torch.tensor([m.config.tts_eos_token_id]))
    text_embed = torch.cat([t.embed_text(torch.tensor(text_ids)), eos])
    codec_embed = torch.cat(
        [t.embed_codec(torch.tensor([m.config.talker.codec_bos_id])), t.embed_frame(ref)]
    )
    assert text_embed.shape[0] > codec_embed.shape[0]
    torch.testing.assert_close(prefill[-3:], text_embed[:3] + codec_embed)
    torch.testing.assert_close(trailing, text_embed[3:])
