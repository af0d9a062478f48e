"""Regenerate ``omni_qwen3_omni/presets/tiny`` (configs, tokenizer, chat template, preprocessor).

The tiny preset keeps the release's layout and every id the code relies on,
at widths of 32-64 so a forward pass takes milliseconds:

* ``config.json``: the full ``qwen3_omni_moe`` root (``thinker_config`` with
  its audio / vision / text sections, ``talker_config``, ``code2wav_config``),
  satisfying the constraints listed in ``shared/reference/models.md``
  (encoder outputs = thinker width = talker ``thinker_hidden_size``, talker
  width = code-predictor width, 16 code groups everywhere, predictor vocab =
  code2wav codebook = talker vocab - 1024, ``sum(mrope_section) == head_dim/2``,
  audio ``n_window`` 50, a square vision position grid, deepstack indexes below
  the vision depth, thinker layers above ``accept_hidden_layer``).
* a byte-level BPE tokenizer (``vocab.json``, ``merges.txt``,
  ``tokenizer_config.json``) that keeps the release's special-token ids
  (151643..151675) and the role words ``user`` (872), ``system`` (8948) and
  ``assistant`` (77091) as single tokens; the ids in between are filler
  entries no merge can produce, so prompts tokenise exactly as the layout of
  the real vocabulary requires while the files stay ~3 MB.
* the chat template, in ``chat_template.json`` (where the release keeps it,
  read first by the reference processor) and, as the same string, under
  ``chat_template`` in ``tokenizer_config.json``.
* ``preprocessor_config.json``: the Whisper feature extractor's and the
  Qwen2-VL image processor's keys merged in one file, as the release ships it.

Everything here is standard-library only: the reference harness
(``tests/reference/make_reference.py``) imports this file by path from the
reference environment to write the same tokenizer files.

Run: ``python plugins/qwen3_omni/tools/make_tiny_preset.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "omni_qwen3_omni" / "presets" / "tiny"

# The release's added tokens, in id order from 151643. ``special`` follows the
# Qwen2.5/Qwen3 convention: tool/think/FIM markers are plain added tokens.
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),  # 151643
    ("<|im_start|>", True),  # 151644
    ("<|im_end|>", True),  # 151645
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),  # 151652
    ("<|vision_end|>", True),  # 151653
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),  # 151655
    ("<|video_pad|>", True),  # 151656
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),  # 151669
    ("<|audio_end|>", True),  # 151670
    ("<tts_pad>", True),  # 151671
    ("<tts_text_bos>", True),  # 151672
    ("<tts_text_eod>", True),  # 151673
    ("<tts_text_bos_single>", True),  # 151674
    ("<|audio_pad|>", True),  # 151675
]
FIRST_ADDED_ID = 151643
# Role words the talker and the chat format rely on, at their release ids.
ROLE_WORDS = {"user": 872, "system": 8948, "assistant": 77091}
# A few extra merges so ordinary text exercises multi-byte tokens too.
COMMON_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "o n", "r e", "e r", "Ġ s", "l l", "o r"]
# Names the processor reads from the tokenizer (``tokenizer.image_token`` ...).
MEDIA_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}

# The Qwen3-Omni chat format, written out for the preset (a real checkpoint
# ships its own template, which ChatPrompter renders instead). Established
# behaviour it reproduces: no default system prompt; ChatML turns
# ``<|im_start|>{role}\n...<|im_end|>\n``; a message's content parts are
# concatenated with no separator, images as
# ``<|vision_start|><|image_pad|><|vision_end|>``, audio as
# ``<|audio_start|><|audio_pad|><|audio_end|>``, video as
# ``<|vision_start|><|video_pad|><|vision_end|>``; the Qwen3 tool preamble,
# tool-response turns and reasoning handling (``<think>`` kept only for
# assistant turns after the last plain-text user query); the generation
# prompt ``<|im_start|>assistant\n``, plus an empty think block when
# ``enable_thinking`` is false.
CHAT_TEMPLATE = r"""
{%- macro flat(content) -%}
  {%- if content is none -%}
  {%- elif content is string -%}
    {{- content -}}
  {%- else -%}
    {%- for part in content -%}
      {%- if part.type == 'image' or 'image' in part or 'image_url' in part -%}
        {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
      {%- elif part.type == 'audio' or 'audio' in part or 'audio_url' in part -%}
        {{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}
      {%- elif part.type == 'video' or 'video' in part -%}
        {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
      {%- elif part.type == 'text' -%}
        {{- part.text -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages[0].role == 'system' -%}
    {{- flat(messages[0].content) + '\n\n' -}}
  {%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}
    {{- '\n' + (tool | tojson) -}}
  {%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and ' -}}
  {{- 'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
  {{- '<|im_start|>system\n' + flat(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- set turn = namespace(scanning=true, last_query=messages|length - 1) -%}
{%- for message in messages[::-1] -%}
  {%- set position = (messages|length - 1) - loop.index0 -%}
  {%- if turn.scanning and message.role == 'user' and message.content is string
        and not (message.content.startswith('<tool_response>')
                 and message.content.endswith('</tool_response>')) -%}
    {%- set turn.scanning = false -%}
    {%- set turn.last_query = position -%}
  {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- set body = flat(message.content) -%}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + message.role + '\n' + body + '<|im_end|>\n' -}}
  {%- elif message.role == 'assistant' -%}
    {%- set thought = '' -%}
    {%- if message.reasoning_content is string -%}
      {%- set thought = message.reasoning_content -%}
    {%- elif '</think>' in body -%}
      {%- set thought = body.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
      {%- set body = body.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- if loop.index0 > turn.last_query and (loop.last or thought) -%}
      {{- '<|im_start|>assistant\n<think>\n' + thought.strip('\n') -}}
      {{- '\n</think>\n\n' + body.lstrip('\n') -}}
    {%- else -%}
      {{- '<|im_start|>assistant\n' + body -}}
    {%- endif -%}
    {%- if message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- if not loop.first or body -%}
          {{- '\n' -}}
        {%- endif -%}
        {%- set fn = call.function if call.function else call -%}
        {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
        {%- if fn.arguments is string -%}
          {{- fn.arguments -}}
        {%- else -%}
          {{- fn.arguments | tojson -}}
        {%- endif -%}
        {{- '}\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- elif message.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + body + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- endif -%}
{%- endif -%}
""".strip()


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character table used by byte-level BPE."""
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


def build_vocab() -> tuple[dict[str, int], list[str]]:
    """The BPE vocabulary (0..151642) and its merges, role words at their release ids."""
    by_id: dict[int, str] = {}
    for ch in sorted(bytes_to_unicode().values(), key=ord):
        by_id[len(by_id)] = ch
    merges: list[str] = []
    free = len(by_id)

    def place(token: str, fixed: int | None = None) -> None:
        nonlocal free
        if token in by_id.values():
            return
        if fixed is None:
            while free in by_id or free in ROLE_WORDS.values():
                free += 1
            fixed = free
        assert fixed not in by_id, (token, fixed)
        by_id[fixed] = token

    # Role words first, so their merge chains outrank everything else.
    for word, word_id in ROLE_WORDS.items():
        current = word[0]
        for ch in word[1:]:
            merges.append(f"{current} {ch}")
            current += ch
            place(current, word_id if current == word else None)
    for pair in COMMON_MERGES:
        merges.append(pair)
        place(pair.replace(" ", ""))
    # Filler entries: digits never merge, so BPE can never produce these. Each
    # decodes to readable text (" w1a2b"), so a random-weight demo's answer is
    # legible junk rather than a stream of broken characters.
    for index in range(FIRST_ADDED_ID):
        if index not in by_id:
            by_id[index] = f"Ġw{index:x}"
    vocab = {token: index for index, token in sorted(by_id.items())}
    assert len(vocab) == FIRST_ADDED_ID, "duplicate vocabulary entries"
    return vocab, merges


def added_tokens_decoder() -> dict[str, dict[str, Any]]:
    return {
        str(FIRST_ADDED_ID + offset): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for offset, (content, special) in enumerate(ADDED_TOKENS)
    }


def write_tokenizer_files(out: Path, chat_template: str = CHAT_TEMPLATE) -> None:
    """Write vocab.json, merges.txt, tokenizer_config.json and chat_template.json into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = build_vocab()
    (out / "vocab.json").write_text(
        json.dumps(vocab, ensure_ascii=False, separators=(",", ":")), encoding="utf-8"
    )
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder(),
        "additional_special_tokens": [c for c, special in ADDED_TOKENS if special][1:],
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "extra_special_tokens": dict(MEDIA_TOKENS),
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "processor_class": "Qwen3OmniMoeProcessor",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=1) + "\n", encoding="utf-8"
    )
    (out / "chat_template.json").write_text(
        json.dumps({"chat_template": chat_template}, indent=1) + "\n", encoding="utf-8"
    )


def preprocessor_config() -> dict[str, Any]:
    """The release's merged preprocessor_config.json (Whisper features + Qwen2-VL images)."""
    return {
        "chunk_length": 300,
        "dither": 0.0,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "hop_length": 160,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": [0.5, 0.5, 0.5],
        "max_pixels": 12845056,
        "merge_size": 2,
        "min_pixels": 3136,
        "n_fft": 400,
        "n_samples": 4800000,
        "nb_max_frames": 30000,
        "padding_side": "right",
        "padding_value": 0.0,
        "patch_size": 16,
        "processor_class": "Qwen3OmniMoeProcessor",
        "return_attention_mask": True,
        "sampling_rate": 16000,
        "temporal_patch_size": 2,
    }


# Release ids shared by the thinker, the talker and the root config.
IDS = {
    "audio_token_id": 151675,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "audio_start_token_id": 151669,
    "audio_end_token_id": 151670,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "position_id_per_seconds": 13,
    "seconds_per_chunk": 2,
}


def model_config(
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    mrope_section: tuple[int, int, int] = (4, 2, 2),
    experts: int = 8,
    top_k: int = 2,
    moe_intermediate: int = 32,
    vocab_size: int = 152064,
    audio_d_model: int = 32,
    audio_layers: int = 2,
    audio_heads: int = 4,
    audio_downsample: int = 16,
    vision_depth: int = 2,
    vision_hidden: int = 32,
    vision_heads: int = 2,
    vision_positions: int = 2304,
    deepstack: tuple[int, ...] = (0, 1),
    accept_hidden_layer: int = 1,
) -> dict[str, Any]:
    """A root ``qwen3_omni_moe`` config.json at the given widths (defaults: the tiny preset)."""
    if sum(mrope_section) * 2 != head_dim:
        raise ValueError("mrope_section must sum to head_dim / 2")
    if accept_hidden_layer >= layers:
        raise ValueError("the thinker needs more layers than accept_hidden_layer")
    codebook, talker_hidden, groups = 64, 32, 16
    rope = {
        "rope_type": "default",
        "type": "default",
        "mrope_section": list(mrope_section),
        "interleaved": True,
        "mrope_interleaved": True,
    }
    thinker = {
        "model_type": "qwen3_omni_moe_thinker",
        **IDS,
        "user_token_id": 872,
        "initializer_range": 0.02,
        "audio_config": {
            "model_type": "qwen3_omni_moe_audio_encoder",
            "num_mel_bins": 128,
            "d_model": audio_d_model,
            "encoder_layers": audio_layers,
            "encoder_attention_heads": audio_heads,
            "encoder_ffn_dim": 2 * audio_d_model,
            "downsample_hidden_size": audio_downsample,
            "output_dim": hidden,
            "n_window": 50,
            "n_window_infer": 800,
            "conv_chunksize": 500,
            "max_source_positions": 1500,
            "activation_function": "gelu",
            "scale_embedding": False,
            "dropout": 0.0,
            "attention_dropout": 0.0,
            "activation_dropout": 0.0,
        },
        "vision_config": {
            "model_type": "qwen3_omni_moe_vision_encoder",
            "depth": vision_depth,
            "hidden_size": vision_hidden,
            "num_heads": vision_heads,
            "intermediate_size": 2 * vision_hidden,
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": hidden,
            "num_position_embeddings": vision_positions,
            "deepstack_visual_indexes": list(deepstack),
        },
        "text_config": {
            "model_type": "qwen3_omni_moe_text",
            "vocab_size": vocab_size,
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": 65536,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_scaling": rope,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "sliding_window": None,
            "use_cache": True,
            "tie_word_embeddings": False,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "moe_intermediate_size": moe_intermediate,
            "shared_expert_intermediate_size": 0,
            "num_experts": experts,
            "num_experts_per_tok": top_k,
            "norm_topk_prob": True,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        },
    }
    layer = {
        "hidden_size": talker_hidden,
        "intermediate_size": 2 * talker_hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 65536,
        "attention_bias": False,
        "sliding_window": None,
    }
    talker = {
        "model_type": "qwen3_omni_moe_talker",
        **IDS,
        "thinker_hidden_size": hidden,
        "accept_hidden_layer": accept_hidden_layer,
        "num_code_groups": groups,
        "spatial_merge_size": 2,
        # Codec control ids and speakers sit in the top 1024 of the talker
        # vocabulary, at the release's offsets from the codebook size.
        "codec_pad_id": codebook + 100,
        "codec_bos_id": codebook + 101,
        "codec_eos_token_id": codebook + 102,
        "codec_nothink_id": codebook + 107,
        "codec_think_bos_id": codebook + 108,
        "codec_think_eos_id": codebook + 109,
        "speaker_id": {
            "chelsie": codebook + 253,
            "ethan": codebook + 254,
            "aiden": codebook + 255,
        },
        "text_config": {
            "model_type": "qwen3_omni_moe_talker_text",
            **layer,
            "vocab_size": codebook + 1024,
            "rope_scaling": {**rope, "mrope_section": [2, 1, 1]},
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "moe_intermediate_size": talker_hidden,
            "shared_expert_intermediate_size": talker_hidden,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
        },
        "code_predictor_config": {
            "model_type": "qwen3_omni_moe_talker_code_predictor",
            **layer,
            "vocab_size": codebook,
            "num_code_groups": groups,
        },
    }
    code2wav = {
        "model_type": "",
        "codebook_size": codebook,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "sliding_window": 72,
        "max_position_embeddings": 8000,
        "rope_theta": 10000,
        "rms_norm_eps": 1e-5,
        "layer_scale_initial_scale": 0.01,
        "num_quantizers": groups,
        "num_semantic_quantizers": 1,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 64,
        "attention_bias": False,
        "hidden_act": "silu",
    }
    return {
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "model_type": "qwen3_omni_moe",
        "enable_audio_output": True,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "system_token_id": 8948,
        "user_token_id": 872,
        "assistant_token_id": 77091,
        "thinker_config": thinker,
        "talker_config": talker,
        "code2wav_config": code2wav,
    }


def generation_config() -> dict[str, Any]:
    """Thinker sampling defaults (stop on ``<|im_end|>`` or ``<|endoftext|>``)."""
    return {
        "bos_token_id": 151643,
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
        "max_new_tokens": 1024,
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write_tokenizer_files(OUT)
    for name, doc in (
        ("config.json", model_config()),
        ("generation_config.json", generation_config()),
        ("preprocessor_config.json", preprocessor_config()),
    ):
        (OUT / name).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
