"""Regenerate ``omni_moss_tts/presets/tiny``: the release's layout at a width of 64.

What it writes, and why each piece is there:

* ``config.json``: a ``moss_tts_delay`` root with a Qwen3 ``language_config``
  (2 layers, hidden 64, 4 heads / 2 KV heads of 16) and the release's 32
  codebooks of 1024 and special ids. The text vocabulary keeps Qwen's size
  (151936) because the delay-pattern ids live at 151643..151662.
* ``generation_config.json``: the release's sampling defaults (text 1.5 /
  top-k 50; audio 1.7 / top-p 0.8 / top-k 25; no repetition penalty).
* ``processor_config.json`` naming the codec as the release does, here the
  relative directory ``codec`` (our loader resolves it against the model
  directory), and ``codec/config.json``: the MOSS audio tokenizer's module
  list at small widths (``omni_moss_tts.codec`` ``tiny_codec_config``).
* tokenizer files: the small offline byte-level BPE of the Qwen3-Omni tiny
  preset (Qwen's special ids at their real places; ``<|vision_start|>`` at
  151652 etc. are the tokens MOSS uses as audio start/end and slots) and a
  ``chat_template.jinja`` with the release's chat format.

Run: ``python plugins/moss_tts/tools/make_tiny_preset.py`` (omni's venv).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "omni_moss_tts" / "presets" / "tiny"
OMNI_TOOL = ROOT.parent / "qwen3_omni" / "tools" / "make_tiny_preset.py"

# The release's chat format: every turn is <|im_start|>role\ncontent<|im_end|>\n.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def model_config() -> dict[str, Any]:
    return {
        "architectures": ["MossTTSDelayModel"],
        "model_type": "moss_tts_delay",
        "language_config": {
            "model_type": "qwen3",
            "vocab_size": 151936,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "hidden_act": "silu",
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "attention_bias": False,
            "tie_word_embeddings": False,
        },
        "n_vq": 32,
        "audio_vocab_size": 1024,
        "audio_pad_code": 1024,
        "pad_token_id": 151643,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "audio_start_token_id": 151652,
        "audio_end_token_id": 151653,
        "audio_user_slot_token_id": 151654,
        "audio_assistant_gen_slot_token_id": 151656,
        "audio_assistant_delay_slot_token_id": 151662,
        "sampling_rate": 24000,
        "initializer_range": 0.02,
    }


def generation_config() -> dict[str, Any]:
    return {
        "text_temperature": 1.5,
        "text_top_p": 1.0,
        "text_top_k": 50,
        "audio_temperature": 1.7,
        "audio_top_p": 0.8,
        "audio_top_k": 25,
        "audio_repetition_penalty": 1.0,
        "max_new_tokens": 4096,
    }


def _omni_tool():
    spec = importlib.util.spec_from_file_location("omni_tiny_tool", OMNI_TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    from omni_moss_tts.codec import tiny_codec_config

    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "codec").mkdir(parents=True)
    _omni_tool().write_tokenizer_files(OUT, CHAT_TEMPLATE)
    (OUT / "chat_template.json").unlink()  # the release keeps its template as .jinja
    (OUT / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n", encoding="utf-8")
    documents = {
        "config.json": model_config(),
        "generation_config.json": generation_config(),
        "processor_config.json": {
            "processor_class": "MossTTSDelayProcessor",
            "audio_tokenizer_name_or_path": "codec",
        },
        "codec/config.json": tiny_codec_config(),
    }
    for name, doc in documents.items():
        (OUT / name).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
