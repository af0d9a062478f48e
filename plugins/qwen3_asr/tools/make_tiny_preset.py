"""Write the ``tiny`` preset of omni-qwen3-asr: configs and tokenizer, no weights.

Run ``python plugins/qwen3_asr/tools/make_tiny_preset.py`` to regenerate
``omni_qwen3_asr/presets/tiny``. The architecture is Qwen3-ASR's at toy
size (two encoder and two decoder layers, widths 64 and 32); the tokenizer is
the byte-level BPE Qwen3-Omni's tiny preset uses (same generator, imported
from its tool), with Qwen3-ASR's added tokens at the ids third-party readers
of the release report: ``<|audio_pad|>`` 151676, ``<asr_text>`` 151704 (a
plain added token: it must survive decoding with special tokens skipped,
which is how the release reads the language header). Ids in between whose
release names are not known here are reserved placeholders.

The chat template is ours, written to the format the release's prompt has
(see ``omni_qwen3_asr/prompt.py``): ChatML turns, the system turn always
present (empty without context), audio as ``<|audio_start|><|audio_pad|><|audio_end|>``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
OUT = HERE.parents[1] / "omni_qwen3_asr" / "presets" / "tiny"
ALIGNER_OUT = OUT.with_name("tiny-aligner")  # config only: it reads the ASR model's tokenizer
OMNI_TOOL = HERE.parents[2] / "qwen3_omni" / "tools" / "make_tiny_preset.py"

AUDIO_PAD_ID = 151676
ASR_TEXT_ID = 151704
TIMESTAMP_ID = 151705

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' or 'audio' in part -%}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _omni_tool() -> Any:
    spec = importlib.util.spec_from_file_location("omni_tiny_tool", OMNI_TOOL)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def added_tokens(tool: Any) -> dict[str, dict[str, Any]]:
    """Qwen3's added tokens up to ``<tts_text_bos_single>``, then Qwen3-ASR's."""
    tokens = [t for t in tool.ADDED_TOKENS if t[0] != "<|audio_pad|>"]
    by_id = {tool.FIRST_ADDED_ID + i: t for i, t in enumerate(tokens)}
    by_id[AUDIO_PAD_ID] = ("<|audio_pad|>", True)
    by_id[ASR_TEXT_ID] = ("<asr_text>", False)
    by_id[TIMESTAMP_ID] = ("<timestamp>", False)
    for index in range(tool.FIRST_ADDED_ID, TIMESTAMP_ID):
        by_id.setdefault(index, (f"<|reserved_{index}|>", True))
    return {
        str(index): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for index, (content, special) in sorted(by_id.items())
    }


def model_config() -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "model_type": "qwen3_asr",
        "support_languages": ["Chinese", "English", "German", "French", "Japanese", "Korean"],
        "thinker_config": {
            "model_type": "qwen3_asr_thinker",
            "audio_token_id": AUDIO_PAD_ID,
            "audio_start_token_id": 151669,
            "user_token_id": 872,
            "audio_config": {
                "num_mel_bins": 128,
                "encoder_layers": 2,
                "encoder_attention_heads": 4,
                "encoder_ffn_dim": 128,
                "d_model": 64,
                "output_dim": 32,
                "n_window": 50,
                "n_window_infer": 200,  # two 1 s chunks: a 5 s clip spans three windows
                "conv_chunksize": 500,
                "downsample_hidden_size": 32,
                "max_source_positions": 1500,
                "activation_function": "gelu",
            },
            "text_config": {
                "vocab_size": 151936,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "hidden_act": "silu",
                "max_position_embeddings": 65536,
                "rms_norm_eps": 1e-6,
                "rope_theta": 5000000.0,
                "rope_scaling": {
                    "rope_type": "default",
                    "mrope_section": [4, 2, 2],
                    "interleaved": True,
                    "mrope_interleaved": True,
                },
                "attention_bias": False,
                "tie_word_embeddings": False,
            },
        },
    }


def preprocessor_config() -> dict[str, Any]:
    return {
        "chunk_length": 30,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "hop_length": 160,
        "n_fft": 400,
        "padding_side": "right",
        "padding_value": 0.0,
        "processor_class": "Qwen3ASRProcessor",
        "return_attention_mask": True,
        "sampling_rate": 16000,
    }


def main() -> None:
    tool = _omni_tool()
    OUT.mkdir(parents=True, exist_ok=True)
    vocab, merges = tool.build_vocab()
    (OUT / "vocab.json").write_text(
        json.dumps(vocab, ensure_ascii=False, separators=(",", ":")), encoding="utf-8"
    )
    (OUT / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    added = added_tokens(tool)
    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "extra_special_tokens": {
            "audio_token": "<|audio_pad|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "processor_class": "Qwen3ASRProcessor",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    files = {
        "tokenizer_config.json": tokenizer_config,
        "chat_template.json": {"chat_template": CHAT_TEMPLATE},
        "config.json": model_config(),
        "generation_config.json": {"eos_token_id": [151645, 151643], "do_sample": False},
        "preprocessor_config.json": preprocessor_config(),
    }
    for name, doc in files.items():
        (OUT / name).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    ALIGNER_OUT.mkdir(exist_ok=True)
    (ALIGNER_OUT / "config.json").write_text(
        json.dumps(aligner_config(), indent=1) + "\n", encoding="utf-8"
    )


def aligner_config() -> dict[str, Any]:
    """Qwen3-ForcedAligner at the same toy size: a 40-class head, 80 ms per class."""
    config = model_config()
    config["thinker_config"].update(model_type="qwen3_forced_aligner", classify_num=40)
    config.update(timestamp_token_id=TIMESTAMP_ID, timestamp_segment_time=80.0)
    return config


if __name__ == "__main__":
    main()
