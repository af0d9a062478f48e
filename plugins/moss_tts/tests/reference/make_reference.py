"""Write a tiny MOSS-TTS checkpoint with the official classes and record their greedy outputs.

Runs inside the MOSS-TTS reference environment (transformers 5.0.0 + OpenMOSS's
sources at pinned commits), never inside omni's: see ``tests/REFERENCE.md``.
Usage::

    python make_reference.py OUT_DIR REQUEST.json

Sources: ``$MOSS_TTS_REF_SRC`` (default ``<sys.prefix>/src``) must hold the
clones ``MOSS-TTS`` and ``MOSS-Audio-Tokenizer``. Tokenizer: the offline
byte-level BPE of ``plugins/qwen3_omni/omni_qwen3_omni/presets/tiny`` (it keeps
Qwen's special ids 151643..151675), or ``$MOSS_TTS_REF_TOKENIZER``.

Request (JSON)::

    {"seed": 0, "max_new_tokens": 60,
     "cases": [
       {"name": "plain", "text": "Hello there.", "language": "English"},
       {"name": "clone", "text": "...", "ref_wav": "/path/clip.wav"},
       {"name": "cont", "text": "...", "ref_wav": "...", "continuation": true,
        "ref_text": "...", "clone_reference": false, "max_new_tokens": 150}],
     "codec": {"wav": "/path/clip.wav", "decode_frames": 40, "seed": 1}}

Case keys besides ``name``/``text``: ``language``, ``tokens``, ``instruction``,
``quality``, ``sound_event``, ``ambient_sound`` (user-message fields),
``ref_wav`` (a clip: clone by reference, or the assistant prefix with
``continuation``), ``ref_text`` (continuation: the user text is
``ref_text + text``), ``clone_reference`` (continuation: also pass the clip as the
user's reference), ``max_new_tokens`` (overrides the request's). ``codec`` is
optional; its ``wav`` defaults to the first case's ``ref_wav``. ``"dtype":
"bfloat16"`` generates with the checkpoint reloaded in bf16 and records, per
case, every step's logits and float32's along the same rows (``run_case``);
the codec stays float32, as the release's processor loads it.

What it writes (``OUT_DIR``):

* ``model/`` -- ``MossTTSDelayModel`` saved with ``save_pretrained`` (safetensors,
  float32), the five remote-code files and ``config.json`` with ``auto_map``, the
  tokenizer files plus ``chat_template.jinja``, and ``processor_config.json``
  naming the codec by absolute path (``audio_tokenizer_name_or_path``), as the
  release lays it out;
* ``codec/`` -- ``MossAudioTokenizerModel`` the same way;
* ``<case>.npz`` per case and ``codec.npz`` (schema in REFERENCE.md);
* ``summary.json``; stdout gets only its one-line digest.

Both checkpoints are reloaded from disk (``AutoProcessor`` / ``AutoModel`` with
``trust_remote_code=True``, ``attn_implementation="eager"``, float32), checked to
equal what was saved, and everything is recorded from the reloaded copies.

Geometry (deliberately unlike any preset of ours): Qwen3 backbone hidden 48,
3 layers, 4 heads / 2 KV heads, head_dim 16, intermediate 96, vocab 151936,
rope_theta 1e6, rms_norm_eps 1e-6, untied; n_vq 32, audio vocab 1024 (+1 pad).
Codec: the release's module chain at width 32/48 -- PatchedPretransform 240,
Transformer, (Patched 2, Transformer) x 3 to the 12.5 Hz quantizer (rlfq, 32 x
1024, codebook_dim 8, rvq_dim 16), and the mirror image back; 1 layer and 2
heads each, feed-forward 4 x d_model, and the input/output projections that are
identities in the release are identities here too. The causal window is 0.4 s
(``int(frame_rate * 0.4)`` frames per stage: 40/20/10/5 going down, 5/10/20/40
coming up), so windowing matters within a second.

Weights: every tensor gets seeded values (seed = request ``seed``; the codec
uses seed + 1): norms 1 + 0.1 N(0,1), biases 0.1 N(0,1), embeddings and codebooks
N(0,1), the other matrices N(0,1)/sqrt(fan_in), weight-norm gains 1 + 0.1 N(0,1),
codec layer scales 0.3 + 0.1 N(0,1), and the codec's last output projection
(decoder transformer -> 240 samples per step) is scaled by 0.02 so the waveform
has rms ~0.1. Random weights alone would never enter
audio or leave it, so three residual-stream dimensions of the backbone are set
by hand as control channels (every other weight stays random):

* dim 0, BIAS: ``embed_tokens[:, 0] = 16`` for every token;
* dim 1, GEN: ``embed_tokens[gen_slot, 1] = 16``, 0 for every other token;
* dim 2, COUNT: written only by layer 0's attention heads 0 and 1, whose query
  rows are zero (so they attend uniformly to the whole causal context) and whose
  shared value head reads GEN alone (``v_proj[0, 1] = 1``, the rest of that KV
  head zero); ``o_proj[2, 0] = 4`` -- so COUNT grows with the share of gen_slot
  tokens in the context;
* no other weight writes dims 0-2 (rows 0-2 of every ``o_proj`` and
  ``down_proj`` are zero, columns 0-2 of every ``emb_ext`` are zero), layer 0's
  input norm and the final norm have weight 1 there, and the audio heads and
  every ordinary text-head row have zero weight on dims 0-2;
* the text head's rows for the special tokens read only the control channels:
  im_end 12 x BIAS, audio_start 10 x BIAS, gen_slot 10 x BIAS, delay_slot
  9 x BIAS + 6.4 x COUNT.

Hence: at step 0 (im_end banned) the model opens audio with audio_start; inside
audio gen_slot wins until gen_slot makes up roughly a quarter of the context,
when delay_slot wins (then ``generate`` forces 31 more delay slots and
audio_end); back outside audio im_end wins and generation stops. Audio codes
come from the random audio heads over the random dims. So each case yields
some tens of frames (more with longer prompts) and, given enough
``max_new_tokens``, the full drain and stop.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TOKENIZER = HERE.parents[2] / "qwen3_omni" / "omni_qwen3_omni" / "presets" / "tiny"

MODEL_FILES = (
    "configuration_moss_tts.py",
    "modeling_moss_tts.py",
    "processing_moss_tts.py",
    "inference_utils.py",
    "tts_robust_normalizer_single_script.py",
)
CODEC_FILES = ("configuration_moss_audio_tokenizer.py", "modeling_moss_audio_tokenizer.py")

# Qwen ids MOSS-TTS uses (configuration_moss_tts.py defaults)
PAD, IM_START, IM_END = 151643, 151644, 151645
AUDIO_START, AUDIO_END, USER_SLOT, GEN_SLOT, DELAY_SLOT = 151652, 151653, 151654, 151656, 151662
N_VQ, AUDIO_VOCAB = 32, 1024

LANGUAGE_CONFIG = {
    "vocab_size": 151936,
    "hidden_size": 48,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
}

# control channels of the backbone's residual stream (see the module docstring)
BIAS, GEN, COUNT = 0, 1, 2
C_BIAS, G_GEN, K_COUNT = 16.0, 16.0, 4.0
TEXT_HEAD_CONTROL = {
    IM_END: {BIAS: 12.0},
    AUDIO_START: {BIAS: 10.0},
    GEN_SLOT: {BIAS: 10.0},
    DELAY_SLOT: {BIAS: 9.0, COUNT: 6.4},
}

CONTEXT_SECONDS = 0.4

CHAT_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n"
)


def _transformer(inp: int, out: int, d_model: int) -> dict:
    return {
        "module_type": "Transformer",
        "input_dimension": inp,
        "output_dimension": out,
        "d_model": d_model,
        "num_heads": 2,
        "num_layers": 1,
        "dim_feedforward": 4 * d_model,
        "causal": True,
        "norm": "layer_norm",
        "positional_embedding": "rope",
        "max_period": 10000,
        "gating": "none",
        "layer_scale": 0.01,
        "conv_layout": True,
    }


def _patch(size: int) -> dict:
    return {"module_type": "PatchedPretransform", "patch_size": size}


# The release's chain (config.json of MOSS-Audio-Tokenizer) scaled down:
# 768 -> 32, 1280 -> 48, 384 -> 16, 640 -> 24, rvq 512 -> 16.
CODEC_CONFIG = {
    "version": "omni-tiny-reference",
    "sampling_rate": 24000,
    "downsample_rate": 1920,
    "causal_transformer_context_duration": CONTEXT_SECONDS,
    "encoder_kwargs": [
        _patch(240),
        _transformer(240, 16, 32),
        _patch(2),
        _transformer(32, 16, 32),
        _patch(2),
        _transformer(32, 24, 32),
        _patch(2),
        _transformer(48, 32, 48),
    ],
    "decoder_kwargs": [
        _transformer(32, 48, 48),
        _patch(2),
        _transformer(24, 32, 32),
        _patch(2),
        _transformer(16, 32, 32),
        _patch(2),
        _transformer(16, 240, 32),
        _patch(240),
    ],
    "quantizer_type": "rlfq",
    "quantizer_kwargs": {
        "input_dim": 32,
        "rvq_dim": 16,
        "output_dim": 32,
        "num_quantizers": N_VQ,
        "codebook_size": AUDIO_VOCAB,
        "codebook_dim": 8,
        "quantizer_type": "rlfq",
    },
}


class HarnessError(RuntimeError):
    pass


def fail(message: str) -> None:
    raise HarnessError(message)


def git_head(path: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


# --------------------------------------------------------------------------- weights


def randomise_backbone(model, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            if not tensor.is_floating_point():
                continue
            if tensor.dim() == 1:
                values = 0.1 * torch.randn(tensor.shape, generator=gen)
                if "norm" in name:
                    values += 1.0
            elif "embed_tokens" in name or "emb_ext" in name:
                values = torch.randn(tensor.shape, generator=gen)
            else:
                values = torch.randn(tensor.shape, generator=gen) / math.sqrt(tensor.shape[1])
            tensor.copy_(values)

        lm = model.language_model
        control = (BIAS, GEN, COUNT)
        emb = lm.embed_tokens.weight
        emb[:, list(control)] = 0.0
        emb[:, BIAS] = C_BIAS
        emb[GEN_SLOT, GEN] = G_GEN
        for ext in model.emb_ext:
            ext.weight[:, list(control)] = 0.0
        for layer in lm.layers:
            layer.self_attn.o_proj.weight[list(control), :] = 0.0
            layer.mlp.down_proj.weight[list(control), :] = 0.0
        layer0 = lm.layers[0]
        head_dim = model.config.language_config.head_dim
        n_heads = model.config.language_config.num_attention_heads
        n_kv = model.config.language_config.num_key_value_heads
        group = n_heads // n_kv
        layer0.self_attn.q_proj.weight[: group * head_dim, :] = 0.0  # heads sharing KV head 0
        layer0.self_attn.v_proj.weight[:head_dim, :] = 0.0
        layer0.self_attn.v_proj.weight[0, GEN] = 1.0
        layer0.self_attn.o_proj.weight[COUNT, 0] = K_COUNT
        layer0.input_layernorm.weight[list(control)] = 1.0
        lm.norm.weight[list(control)] = 1.0
        for head in model.lm_heads:
            head.weight[:, list(control)] = 0.0
        text_head = model.lm_heads[0].weight
        for token, channels in TEXT_HEAD_CONTROL.items():
            text_head[token, :] = 0.0
            for dim, value in channels.items():
                text_head[token, dim] = value


def randomise_codec(model, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    state = model.state_dict()
    # the waveform comes out of the last decoder transformer's output_proj: scale it
    # so the decoded audio is audio-sized (rms ~0.1) rather than ~6
    last_out = max(
        int(n.split(".")[1]) for n in state if n.startswith("decoder.") and ".output_proj." in n
    )
    with torch.no_grad():
        for name, tensor in sorted(state.items()):
            if not tensor.is_floating_point():
                continue
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("parametrizations.weight.original0"):  # weight-norm gain [out, 1, 1]
                values = 1.0 + 0.1 * torch.randn(tensor.shape, generator=gen)
            elif name.endswith("parametrizations.weight.original1") or "codebook" in name:
                values = torch.randn(tensor.shape, generator=gen)
            elif leaf == "scale":  # layer scale
                values = 0.3 + 0.1 * torch.randn(tensor.shape, generator=gen)
            elif tensor.dim() == 1:
                values = 0.1 * torch.randn(tensor.shape, generator=gen)
                if "norm" in name and leaf == "weight":
                    values += 1.0
            else:
                fan_in = max(tensor[0].numel(), 1)
                values = torch.randn(tensor.shape, generator=gen) / math.sqrt(fan_in)
                if name == f"decoder.{last_out}.output_proj.weight":
                    values *= 0.02
            tensor.copy_(values)


def same_state(a, b, what: str) -> None:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    if set(sa) != set(sb):
        fail(f"{what}: reloaded tensors differ by name: {sorted(set(sa) ^ set(sb))[:10]}")
    for key in sa:
        if not torch.equal(sa[key].cpu(), sb[key].cpu()):
            fail(f"{what}: tensor {key} changed between save_pretrained and from_pretrained")


# --------------------------------------------------------------------------- checkpoint


def write_checkpoints(out: Path, src: Path, tokenizer_dir: Path, seed: int) -> dict:
    import torch
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    tts_src = src / "MOSS-TTS" / "moss_tts_delay"
    codec_src = src / "MOSS-Audio-Tokenizer"
    model_dir, codec_dir = out / "model", out / "codec"
    for d in (model_dir, codec_dir):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    for name in MODEL_FILES:
        shutil.copy(tts_src / name, model_dir / name)
    for name in CODEC_FILES:
        shutil.copy(codec_src / name, codec_dir / name)

    # codec
    codec_auto_map = json.loads((codec_src / "config.json").read_text())["auto_map"]
    codec_cfg_cls = get_class_from_dynamic_module(codec_auto_map["AutoConfig"], str(codec_dir))
    codec_cls = get_class_from_dynamic_module(codec_auto_map["AutoModel"], str(codec_dir))
    codec_config = codec_cfg_cls(**json.loads(json.dumps(CODEC_CONFIG)))
    codec_config.auto_map = codec_auto_map
    codec_config.architectures = ["MossAudioTokenizerModel"]
    torch.manual_seed(seed + 1)
    codec = codec_cls(codec_config).eval()
    randomise_codec(codec, seed + 1)
    codec.save_pretrained(codec_dir, safe_serialization=True)

    # backbone
    auto_map = {
        "AutoConfig": "configuration_moss_tts.MossTTSDelayConfig",
        "AutoModel": "modeling_moss_tts.MossTTSDelayModel",
    }
    # transformers 5.0.0 copies a local folder's remote code one level of relative
    # imports deep (dynamic_module_utils.get_cached_module_file) but then follows
    # them all: importing modeling_moss_tts first fails on the normaliser that only
    # processing_moss_tts imports. Import the processor module first, as the
    # release's README does (AutoProcessor before AutoModel).
    get_class_from_dynamic_module("processing_moss_tts.MossTTSDelayProcessor", str(model_dir))
    cfg_cls = get_class_from_dynamic_module(auto_map["AutoConfig"], str(model_dir))
    model_cls = get_class_from_dynamic_module(auto_map["AutoModel"], str(model_dir))
    config = cfg_cls(language_config=dict(LANGUAGE_CONFIG), n_vq=N_VQ, audio_vocab_size=AUDIO_VOCAB)
    config.auto_map = auto_map
    config.architectures = ["MossTTSDelayModel"]
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    randomise_backbone(model, seed)
    model.save_pretrained(model_dir, safe_serialization=True)

    # save_pretrained writes auto_map only for classes registered as auto classes: make sure
    for d, amap in ((model_dir, auto_map), (codec_dir, codec_auto_map)):
        cfg_path = d / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["auto_map"] = amap
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        for name in MODEL_FILES if d == model_dir else CODEC_FILES:
            if not (d / name).exists():
                fail(f"{d}/{name} missing after save_pretrained")

    # tokenizer: the tiny offline BPE with Qwen's special ids, MOSS's ChatML template
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tokenizer_dir / name, model_dir / name)
    tok_cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    for key in ("chat_template", "processor_class", "extra_special_tokens"):
        tok_cfg.pop(key, None)
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1) + "\n")
    (model_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    processor_config = {
        "processor_class": "MossTTSDelayProcessor",
        "auto_map": {"AutoProcessor": "processing_moss_tts.MossTTSDelayProcessor"},
        "audio_tokenizer_name_or_path": str(codec_dir.resolve()),
    }
    (model_dir / "processor_config.json").write_text(json.dumps(processor_config, indent=2) + "\n")
    return {"model": model, "codec": codec, "model_dir": model_dir, "codec_dir": codec_dir}


# --------------------------------------------------------------------------- running


def read_wav(path: str):
    import soundfile as sf
    import torch

    data, sr = sf.read(path, dtype="float32", always_2d=True)  # [S, C]
    return torch.from_numpy(data.T.copy()), int(sr)  # [C, S]


def first_index(values, token) -> int | None:
    hits = (values == token).nonzero()
    return int(hits[0, 0]) if len(hits) else None


def run_case(
    case: dict, processor, model, default_max_new: int, float32_model=None
) -> tuple[dict, dict]:
    """One case on ``model``; with ``float32_model`` (a bf16 run), also every step's logits.

    Then ``step_text_logits`` / ``step_audio_logits`` are the logits each of
    ``generate``'s forward calls returned (the ones its greedy picks read), and
    ``fp32_text_logits`` / ``fp32_audio_logits`` the float32 model's at the same
    positions, teacher-forced along the bf16 run's own rows (one forward pass).
    """
    import numpy as np
    import torch

    name = case["name"]
    text = case["text"]
    user_fields = {
        k: case.get(k)
        for k in ("language", "tokens", "instruction", "quality", "sound_event", "ambient_sound")
    }
    max_new = int(case.get("max_new_tokens", default_max_new))
    continuation = bool(case.get("continuation", False))
    arrays: dict = {}
    ref_codes = None
    if case.get("ref_wav"):
        wav, sr = read_wav(case["ref_wav"])
        ref_codes = processor.encode_audios_from_wav([wav], sr)[0]
        arrays["ref_codes"] = ref_codes.numpy().astype(np.int64)
    elif continuation:
        fail(f"case {name}: continuation needs ref_wav")

    if continuation:
        user_text = case.get("ref_text", "") + text
        reference = [ref_codes] if case.get("clone_reference") else None
        user = processor.build_user_message(text=user_text, reference=reference, **user_fields)
        conversation = [user, processor.build_assistant_message(audio_codes_list=[ref_codes])]
        mode = "continuation"
    else:
        user_text = text
        reference = [ref_codes] if ref_codes is not None else None
        user = processor.build_user_message(text=user_text, reference=reference, **user_fields)
        conversation = [user]
        mode = "generation"

    processing = importlib.import_module(type(processor).__module__)
    text_normalized = processing.normalize_tts_text(user_text)
    batch = processor([conversation], mode=mode)
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    if input_ids.dim() != 3 or input_ids.shape[0] != 1 or input_ids.shape[2] != N_VQ + 1:
        fail(f"case {name}: processor gave input_ids {tuple(input_ids.shape)}")
    seq_len = input_ids.shape[1]

    with torch.inference_mode():
        prompt_out = model(input_ids=input_ids, attention_mask=attention_mask)
    step0_text = prompt_out.logits[0][0, -1].float()
    step0_audio = torch.stack([lg[0, -1].float() for lg in prompt_out.logits[1:]])

    steps: list = []
    hook = None
    if float32_model is not None:

        def record(_module, _args, output):
            logits = output.logits
            steps.append(
                (logits[0][0, -1].float(), torch.stack([lg[0, -1].float() for lg in logits[1:]]))
            )

        hook = model.register_forward_hook(record)
    t0 = time.perf_counter()
    try:
        outputs = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new,
            text_temperature=0,
            audio_temperature=0,
        )
    finally:
        if hook is not None:
            hook.remove()
    seconds = time.perf_counter() - t0
    start_length, cur = outputs[0]
    start_length = int(start_length)
    if not torch.equal(cur[:start_length], input_ids[0, seq_len - start_length :]):
        fail(f"case {name}: generate's output does not start with the prompt's tail")
    generated = cur[start_length:]
    if float32_model is not None:
        if len(steps) != generated.shape[0]:
            fail(f"case {name}: {len(steps)} forward calls for {generated.shape[0]} rows")
        arrays.update(teacher_forced(float32_model, input_ids, generated, steps))

    # processor.decode's audio path (_parse_audio_codes), minus its chunked codec decode
    audio_rows = cur[:, 1:]
    codes = torch.zeros(0, N_VQ, dtype=torch.long)
    segments = []
    if audio_rows.shape[0] >= N_VQ:
        dedelayed = processor.apply_de_delay_pattern(audio_rows)
        non_pad = ~(dedelayed == AUDIO_VOCAB).all(dim=1)
        idx = torch.nonzero(non_pad).squeeze(1)
        if idx.numel():
            breaks = torch.where(idx[1:] != idx[:-1] + 1)[0] + 1
            segments = (
                [dedelayed[s] for s in torch.split(idx, breaks.tolist())]
                if breaks.numel()
                else [dedelayed[idx]]
            )
            codes = segments[0]
    if (codes == AUDIO_VOCAB).any():
        fail(f"case {name}: a decoded frame mixes pad and codes")
    wav = torch.zeros(0)
    trim_samples = 0
    if codes.shape[0]:
        dec = processor.audio_tokenizer.decode(codes.T.contiguous()[:, None, :], return_dict=True)
        wav = dec.audio[0, 0, : int(dec.audio_lengths[0])].float()
        if start_length > 0:
            ratio = max(0.0, min(float(start_length) / float(codes.shape[0]), 1.0))
            trim_samples = int(wav.shape[-1] * ratio)

    try:
        content = processor._parse_text_codes(start_length, cur[:, 0])
    except Exception as exc:  # recorded, not fatal
        content = f"<error {type(exc).__name__}: {exc}>"
    try:
        processor.decode(outputs)
        processor_decode = "ok"
    except Exception as exc:  # the release's chunked decode needs an 8 s window
        processor_decode = f"{type(exc).__name__}: {exc}"

    text_ids = generated[:, 0]
    arrays.update(
        input_ids=input_ids[0].numpy().astype(np.int64),
        attention_mask=attention_mask[0].numpy().astype(bool),
        generated=generated.numpy().astype(np.int64),
        start_length=np.int64(start_length),
        codes=codes.numpy().astype(np.int64),
        wav=wav.numpy().astype(np.float32),
        trim_samples=np.int64(trim_samples),
        step0_text_logits=step0_text.numpy().astype(np.float32),
        step0_audio_logits=step0_audio.numpy().astype(np.float32),
        text_normalized=np.array(text_normalized),
        user_content=np.array(user["content"]),
        prompt_text=np.array(processor.tokenizer.decode(input_ids[0, :, 0].tolist())),
    )
    stopped = "im_end" if bool((text_ids == IM_END).any()) else "max_new_tokens"
    summary = {
        "name": name,
        "mode": mode,
        "max_new_tokens": max_new,
        "prompt_len": int(seq_len),
        "n_generated": int(generated.shape[0]),
        "first_text_ids": text_ids[:8].tolist(),
        "last_text_ids": text_ids[-4:].tolist(),
        "n_gen_slot": int((text_ids == GEN_SLOT).sum()),
        "n_delay_slot": int((text_ids == DELAY_SLOT).sum()),
        "first_audio_start_step": first_index(text_ids, AUDIO_START),
        "first_delay_slot_step": first_index(text_ids, DELAY_SLOT),
        "audio_end_step": first_index(text_ids, AUDIO_END),
        "im_end_step": first_index(text_ids, IM_END),
        "stopped_by": stopped,
        "frames": int(codes.shape[0]),
        "audio_segments": len(segments),
        "ref_frames": None if ref_codes is None else int(ref_codes.shape[0]),
        "start_length": start_length,
        "trim_samples": trim_samples,
        "wav_samples": int(wav.shape[-1]),
        "distinct_codes_ch0": int(codes[:, 0].unique().numel()) if codes.shape[0] else 0,
        "decoded_content": content,
        "processor_decode": processor_decode,
        "generate_seconds": round(seconds, 3),
        "shapes": {k: list(np.shape(v)) for k, v in arrays.items()},
    }
    return arrays, summary


def teacher_forced(float32_model, input_ids, generated, steps: list) -> dict:
    """The bf16 run's per-step logits, and float32's along the same rows (one forward pass).

    Call t of ``generate`` read the prompt plus rows ``0..t-1`` and produced
    row t's logits, so the float32 model fed the prompt and rows ``0..N-2``
    gives the same N positions (a full pass, not a KV-cached loop: the two
    differ by float32 rounding, far below bf16's).
    """
    import numpy as np
    import torch

    n = generated.shape[0]
    sequence = torch.cat([input_ids[0], generated[: n - 1]])[None]
    with torch.inference_mode():
        out = float32_model(input_ids=sequence, attention_mask=torch.ones(sequence.shape[:2]))
    first = input_ids.shape[1] - 1
    text32 = out.logits[0][0, first:].float()
    audio32 = torch.stack([lg[0, first:].float() for lg in out.logits[1:]], dim=1)
    return {
        "step_text_logits": torch.stack([t for t, _ in steps]).numpy().astype(np.float32),
        "step_audio_logits": torch.stack([a for _, a in steps]).numpy().astype(np.float32),
        "fp32_text_logits": text32.numpy().astype(np.float32),
        "fp32_audio_logits": audio32.numpy().astype(np.float32),
    }


def run_codec(spec: dict, processor, seed: int) -> tuple[dict, dict]:
    import numpy as np
    import torch

    codec = processor.audio_tokenizer
    wav, sr = read_wav(spec["wav"])
    seen: list = []
    original = codec.batch_encode

    def recording_batch_encode(wav_list, *args, **kwargs):
        seen.extend(w.detach().clone() for w in wav_list)
        return original(wav_list, *args, **kwargs)

    codec.batch_encode = recording_batch_encode
    try:
        codes = processor.encode_audios_from_wav([wav], sr)[0]
    finally:
        del codec.batch_encode
    if len(seen) != 1:
        fail("codec: batch_encode was not called exactly once")
    frames = int(spec.get("decode_frames", 40))
    gen = torch.Generator().manual_seed(int(spec.get("seed", seed + 2)))
    decode_codes = torch.randint(0, AUDIO_VOCAB, (frames, N_VQ), generator=gen)
    with torch.inference_mode():
        dec = codec.decode(decode_codes.T.contiguous()[:, None, :], return_dict=True)
        rt = codec.decode(codes.T.contiguous()[:, None, :], return_dict=True)
    decode_wav = dec.audio[0, 0, : int(dec.audio_lengths[0])].float()
    codes_wav = rt.audio[0, 0, : int(rt.audio_lengths[0])].float()
    arrays = {
        "wav_in": seen[0].float().numpy().astype(np.float32),
        "codes": codes.numpy().astype(np.int64),
        "codes_wav": codes_wav.numpy().astype(np.float32),
        "decode_codes": decode_codes.numpy().astype(np.int64),
        "decode_wav": decode_wav.numpy().astype(np.float32),
    }
    summary = {
        "wav": str(spec["wav"]),
        "sample_rate_in": sr,
        "frames": int(codes.shape[0]),
        "decode_frames": frames,
        "shapes": {k: list(v.shape) for k, v in arrays.items()},
    }
    return arrays, summary


def main(argv: list[str]) -> dict:
    if len(argv) != 3:
        fail("usage: make_reference.py OUT_DIR REQUEST_JSON")
    out = Path(argv[1]).resolve()
    request = json.loads(Path(argv[2]).read_text())
    out.mkdir(parents=True, exist_ok=True)
    # remote code is imported from a per-output module cache; nothing leaves the machine
    os.environ["HF_MODULES_CACHE"] = str(out / ".hf_modules")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    src = Path(os.environ.get("MOSS_TTS_REF_SRC") or Path(sys.prefix) / "src")
    tokenizer_dir = Path(
        os.environ.get("MOSS_TTS_REF_TOKENIZER")
        or request.get("tokenizer_dir")
        or DEFAULT_TOKENIZER
    )
    for path in (
        [src / "MOSS-TTS" / "moss_tts_delay" / f for f in MODEL_FILES]
        + [src / "MOSS-Audio-Tokenizer" / f for f in (*CODEC_FILES, "config.json")]
        + [tokenizer_dir / f for f in ("vocab.json", "merges.txt", "tokenizer_config.json")]
    ):
        if not path.is_file():
            fail(
                f"missing {path} (set MOSS_TTS_REF_SRC / MOSS_TTS_REF_TOKENIZER;"
                " see plugins/moss_tts/tests/REFERENCE.md)"
            )

    try:
        import numpy as np
        import torch
        import transformers
        from transformers import AutoModel, AutoProcessor
    except ImportError as exc:
        fail(f"{exc}: run this with the MOSS-TTS reference python (make moss-reference-env)")
    if transformers.__version__ != "5.0.0":
        fail(
            f"transformers {transformers.__version__}: the reference pins 5.0.0"
            " (make moss-reference-env)"
        )

    torch.set_num_threads(int(request.get("threads", 1)))
    seed = int(request.get("seed", 0))
    torch.manual_seed(seed)
    timings: dict = {}
    t0 = time.perf_counter()
    built = write_checkpoints(out, src, tokenizer_dir, seed)
    timings["build_and_save"] = round(time.perf_counter() - t0, 3)

    t0 = time.perf_counter()
    processor = AutoProcessor.from_pretrained(str(built["model_dir"]), trust_remote_code=True)
    model = AutoModel.from_pretrained(
        str(built["model_dir"]),
        trust_remote_code=True,
        attn_implementation="eager",
        dtype=torch.float32,
    ).eval()
    same_state(built["model"], model, "model")
    # "dtype": "bfloat16" runs the cases on the same checkpoint loaded in bf16, as the
    # release's README loads it on a GPU; the codec stays as the processor loads it
    # (its config.json says float32 and the processor passes no dtype)
    run_dtype = request.get("dtype", "float32")
    if run_dtype not in ("float32", "bfloat16"):
        fail(f"request dtype {run_dtype!r}: float32 or bfloat16")
    generating, float32_model = model, None
    if run_dtype == "bfloat16":
        generating = AutoModel.from_pretrained(
            str(built["model_dir"]),
            trust_remote_code=True,
            attn_implementation="eager",
            dtype=torch.bfloat16,
        ).eval()
        if next(generating.parameters()).dtype != torch.bfloat16:
            fail("the model did not load in bfloat16")
        float32_model = model
    same_state(built["codec"], processor.audio_tokenizer, "codec")
    processor.audio_tokenizer.eval()
    timings["load"] = round(time.perf_counter() - t0, 3)

    tok = processor.tokenizer
    special = {}
    for token_id in (
        PAD,
        IM_START,
        IM_END,
        AUDIO_START,
        AUDIO_END,
        USER_SLOT,
        GEN_SLOT,
        DELAY_SLOT,
    ):
        piece = tok.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str) or tok.convert_tokens_to_ids(piece) != token_id:
            fail(f"tokenizer: id {token_id} is not a single token ({piece!r})")
        if tok.encode(piece) != [token_id]:
            fail(f"tokenizer: {piece!r} does not encode back to [{token_id}]")
        special[token_id] = piece
    for word, token_id in (("assistant", 77091), ("\n", 198)):
        if tok.encode(word) != [token_id]:  # generate()'s "+ 3" assumes both are one token
            fail(f"tokenizer: {word!r} is not the single token {token_id}")

    cases_summary = []
    default_max_new = int(request.get("max_new_tokens", 60))
    names = set()
    for case in request.get("cases", []):
        if case["name"] in names or not case["name"].replace("_", "").replace("-", "").isalnum():
            fail(f"bad or repeated case name {case['name']!r}")
        names.add(case["name"])
        arrays, summary = run_case(case, processor, generating, default_max_new, float32_model)
        np.savez_compressed(out / f"{case['name']}.npz", **arrays)
        cases_summary.append(summary)
    timings["cases"] = round(sum(c["generate_seconds"] for c in cases_summary), 3)

    codec_summary = None
    codec_spec = dict(request.get("codec") or {})
    if "wav" not in codec_spec:
        first = next((c["ref_wav"] for c in request.get("cases", []) if c.get("ref_wav")), None)
        if first:
            codec_spec["wav"] = first
    if codec_spec.get("wav"):
        t0 = time.perf_counter()
        arrays, codec_summary = run_codec(codec_spec, processor, seed)
        np.savez_compressed(out / "codec.npz", **arrays)
        timings["codec"] = round(time.perf_counter() - t0, 3)

    summary = {
        "ok": True,
        "seed": seed,
        "dtype": run_dtype,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "commits": {
            "MOSS-TTS": git_head(src / "MOSS-TTS"),
            "MOSS-Audio-Tokenizer": git_head(src / "MOSS-Audio-Tokenizer"),
        },
        "model_dir": str(built["model_dir"]),
        "codec_dir": str(built["codec_dir"]),
        "special_tokens": {str(k): v for k, v in special.items()},
        "language_config": LANGUAGE_CONFIG,
        "codec_config": CODEC_CONFIG,
        "control_channels": {
            "bias_dim": BIAS,
            "gen_dim": GEN,
            "count_dim": COUNT,
            "bias": C_BIAS,
            "gen": G_GEN,
            "count_gain": K_COUNT,
            "text_head": {
                str(k): {str(d): v for d, v in ch.items()} for k, ch in TEXT_HEAD_CONTROL.items()
            },
        },
        "cases": cases_summary,
        "codec": codec_summary,
        "timings": timings,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    real_stdout = sys.stdout
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = main(sys.argv)
        digest = {
            "ok": True,
            "out": str(Path(sys.argv[1]).resolve()),
            "seconds": round(time.perf_counter() - started, 2),
            "cases": {
                c["name"]: {
                    "frames": c["frames"],
                    "stopped_by": c["stopped_by"],
                    "n_generated": c["n_generated"],
                }
                for c in result["cases"]
            },
            "codec_frames": None if result["codec"] is None else result["codec"]["frames"],
        }
        print(json.dumps(digest), file=real_stdout)
    except Exception as exc:  # one clear line on stderr, non-zero exit
        traceback.print_exc(file=sys.stderr)
        print(f"make_reference.py failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
