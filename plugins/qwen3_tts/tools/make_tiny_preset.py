"""Regenerate ``omni_qwen3_tts/presets/tiny`` (configs and a tiny byte-level BPE tokenizer).

The tiny preset keeps the real architecture's structure (16 codebooks, the
codec control ids in the top 1024 of the talker vocabulary, M-RoPE sections,
1920 samples per frame) at widths of 32-64, so it runs in milliseconds.
Run: ``python plugins/qwen3_tts/tools/make_tiny_preset.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "omni_qwen3_tts" / "presets" / "tiny"

WORD_CHAINS = ["assistant", "user"]
COMMON = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "o n", "r e", "e r", "Ġ s", "l l", "o r", "e n"]
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
]


def bytes_to_unicode() -> dict[int, str]:
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def main() -> None:
    vocab: dict[str, int] = {}
    for ch in sorted(bytes_to_unicode().values(), key=lambda c: ord(c)):
        vocab[ch] = len(vocab)
    merges: list[str] = []
    for word in WORD_CHAINS:
        current = word[0]
        for ch in word[1:]:
            merges.append(f"{current} {ch}")
            current += ch
            vocab.setdefault(current, len(vocab))
    for pair in COMMON:
        merges.append(pair)
        vocab.setdefault(pair.replace(" ", ""), len(vocab))
    added = {}
    for token in SPECIALS:
        added[str(len(vocab) + len(added))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    ids = {spec["content"]: int(i) for i, spec in added.items()}
    text_vocab = len(vocab) + len(added)

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "speech_tokenizer").mkdir(exist_ok=True)
    (OUT / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (OUT / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    (OUT / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": added, "model_max_length": 4096}, indent=1),
        encoding="utf-8",
    )
    layer = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "num_code_groups": 16,
    }
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_type": "custom_voice",
        "tts_model_size": "tiny",
        "im_start_token_id": ids["<|im_start|>"],
        "im_end_token_id": ids["<|im_end|>"],
        "tts_pad_token_id": ids["<|tts_pad|>"],
        "tts_bos_token_id": ids["<|tts_bos|>"],
        "tts_eos_token_id": ids["<|tts_eos|>"],
        "talker_config": {
            **layer,
            "vocab_size": 1088,
            "text_vocab_size": text_vocab,
            "text_hidden_size": 32,
            "rope_theta": 1000000,
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [2, 1, 1],
                "interleaved": True,
            },
            "max_position_embeddings": 4096,
            "codec_pad_id": 100,
            "codec_bos_id": 101,
            "codec_eos_token_id": 102,
            "codec_think_id": 106,
            "codec_nothink_id": 107,
            "codec_think_bos_id": 108,
            "codec_think_eos_id": 109,
            "codec_language_id": {"english": 80, "chinese": 81, "sichuan_dialect": 82},
            "spk_id": {"serena": 90, "ryan": 91, "eric": 92},
            "spk_is_dialect": {"serena": False, "ryan": False, "eric": "sichuan_dialect"},
            "code_predictor_config": {**layer, "vocab_size": 64, "rope_theta": 1000000},
        },
        "speaker_encoder_config": {
            "mel_dim": 128,
            "enc_dim": 32,
            "enc_channels": [16, 16, 16, 16, 48],
            "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 8,
            "enc_res2net_scale": 4,
            "enc_se_channels": 8,
            "sample_rate": 24000,
        },
    }
    generation = {
        "do_sample": True,
        "top_k": 50,
        "top_p": 1.0,
        "temperature": 0.9,
        "repetition_penalty": 1.05,
        "subtalker_dosample": True,
        "subtalker_top_k": 50,
        "subtalker_top_p": 1.0,
        "subtalker_temperature": 0.9,
        "max_new_tokens": 2048,
    }
    speech = {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "decoder_config": {
            "codebook_size": 64,
            "codebook_dim": 16,
            "hidden_size": 32,
            "latent_dim": 32,
            "head_dim": 8,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "sliding_window": 4,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_quantizers": 16,
            "upsample_rates": [8, 5, 4, 3],
            "upsampling_ratios": [2, 2],
            "decoder_dim": 64,
            "rms_norm_eps": 1e-5,
            "layer_scale_initial_scale": 0.01,
            "rope_theta": 10000,
        },
        "encoder_config": {
            "sampling_rate": 24000,
            "frame_rate": 12.5,
            "audio_channels": 1,
            "hidden_size": 32,
            "num_filters": 4,
            "num_residual_layers": 1,
            "upsampling_ratios": [8, 6, 5, 4],
            "codebook_size": 64,
            "codebook_dim": 16,
            "num_quantizers": 16,
            "vector_quantization_hidden_dimension": 16,
            "num_semantic_quantizers": 1,
            "upsample_groups": 32,
            "num_hidden_layers": 2,
            "intermediate_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 8,
            "sliding_window": 250,
            "use_causal_conv": True,
            "pad_mode": "constant",
        },
    }
    for name, doc in (
        ("config.json", config),
        ("generation_config.json", generation),
        ("speech_tokenizer/config.json", speech),
    ):
        (OUT / name).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
