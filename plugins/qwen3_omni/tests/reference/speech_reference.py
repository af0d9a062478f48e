"""Record transformers' spoken answers end to end: thinker tokens, talker codes, waveform.

Runs inside the reference environment (transformers 4.57.3), never inside
omni's. Usage::

    python speech_reference.py OUT_DIR REQUEST.json

Builds a tiny ``Qwen3OmniMoeForConditionalGeneration`` with every part
present (thinker as in ``make_reference.py``: width 48, 3 layers, 6 experts
top-3, deepstack after blocks 0 and 2, ``accept_hidden_layer`` 2; a talker
unlike our ``tiny`` preset's: width 48, 3 layers, 6 experts top-3 without
top-k renormalisation, a shared expert of width 36, head_dim 12 with M-RoPE
section [2, 2, 2], 8 code groups over a codebook of 80; a code predictor of 2
layers; a code2wav of width 40 with 2 grouped-query layers, a 6-frame window
and the release's upsampling, so 1920 samples per frame at 24 kHz), gives
every tensor seeded O(1) values (code2wav: ``code2wav_reference.py``'s damped
values, so the waveform is not clipped), saves it with ``save_pretrained``
plus the tokenizer and processor files (as ``make_reference.py`` does) and
runs the library's own ``generate(..., return_audio=True, speaker=...)``
greedily on each case: ``thinker_do_sample=False``, ``talker_do_sample=False``,
the code predictor forced greedy (the release samples it whatever
``talker_do_sample`` says), the talker's own defaults otherwise (repetition
penalty 1.05, control ids suppressed).

The waveform recorded is the UNCHUNKED code2wav forward of the talker's codes
(``model.code2wav(codes)``, ``1920 * F - 555`` samples): ``generate`` itself
decodes in 300-frame chunks with 25 frames of left context and loses samples
at every chunk boundary, which a stateful stream does not copy. What
``generate`` returned is kept too (``wav_generate``), for information.

Request (JSON; every key optional)::

    {"seed": 3, "thinker_max_new_tokens": 12, "talker_max_new_tokens": 31,
     "attn_implementation": "sdpa", "max_shard_size": "10MB",
     "images": {"NAME": [height, width]}, "audios": {"NAME": seconds},
     "cases": [{"name": str, "speaker": str, "messages": [...]}],
     "bf16": false}

Messages as in ``make_reference.py`` (a media part names its input).

Output (``OUT_DIR``)::

    ckpt/                 the checkpoint (layout as make_reference.py writes it)
    ref/manifest.json     versions, settings, per case: name, speaker, messages,
                          images / audios (files, prompt order), prompt,
                          input_ids, generated_ids, text (the processor's
                          tokenizer, special tokens skipped), frames,
                          stopped_on_eos (the talker's), min margins
    ref/inputs/NAME.png|wav  as make_reference.py writes them
    ref/CASE.safetensors  generated_ids [N], thinker_margins [N],
                          codes [F, G] (the frames), code0 [F + 1] (every
                          codebook-0 token sampled, the last one has no frame
                          unless the talker hit its limit), code0_margins,
                          code0_logits [F + 1, V] (the talker's raw codebook-0
                          logits at each step, before the penalty and bans),
                          predictor_margins [F, G - 1] (top-1 minus top-2 at
                          each greedy pick), wav [1920 F - 555] (the unchunked
                          forward), wav_generate (generate's chunked output)
    ref/bf16/CASE.safetensors  with ``"bf16": true`` in the request: the same,
                          the checkpoint loaded as ``from_pretrained(dtype=
                          torch.bfloat16)`` and the features cast to bf16
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path

import torch

torch.set_num_threads(1)

# Before transformers imports torchvision (see make_reference.py); import it
# now so that code2wav_reference.py's "hide torchvision" finds it present.
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("_stub"))
import torchvision  # noqa: E402, F401

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"omni_ref_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mk = _load("make_reference")
c2w = _load("code2wav_reference")

import soundfile  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    Qwen3OmniMoeProcessor,
)

CODEBOOK, GROUPS = 80, 8
IM_END = 151645
INPUTS = {
    "text": [mk.SYSTEM, {"role": "user", "content": "Tell me the weather."}],
    "image_audio": [
        mk.SYSTEM,
        {
            "role": "user",
            "content": [
                {"type": "image", "image": "tall"},
                {"type": "audio", "audio": "clip"},
                {"type": "text", "text": "Describe both."},
            ],
        },
    ],
}
SPEAKERS = ["Ethan", "Chelsie"]
#: Each input spoken by each speaker: text_ethan, text_chelsie, image_audio_ethan, ...
DEFAULT_CASES = [
    {"name": f"{name}_{speaker.lower()}", "speaker": speaker, "messages": messages}
    for name, messages in INPUTS.items()
    for speaker in SPEAKERS
]
DEFAULT_IMAGES = {"tall": [120, 80]}
DEFAULT_AUDIOS = {"clip": 2.3}


def speech_config(tool) -> dict:
    """make_reference.py's thinker, with a talker and a code2wav unlike the tiny preset's."""
    root = mk.reference_config(tool)
    talker = root["talker_config"]
    talker.update(
        num_code_groups=GROUPS,
        codec_pad_id=CODEBOOK + 100,
        codec_bos_id=CODEBOOK + 101,
        codec_eos_token_id=CODEBOOK + 102,
        codec_nothink_id=CODEBOOK + 107,
        codec_think_bos_id=CODEBOOK + 108,
        codec_think_eos_id=CODEBOOK + 109,
        speaker_id={"chelsie": CODEBOOK + 253, "ethan": CODEBOOK + 254, "aiden": CODEBOOK + 255},
    )
    layer = {
        "hidden_size": 48,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 12,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 65536,
        "attention_bias": False,
        "sliding_window": None,
    }
    talker["text_config"].update(
        **layer,
        vocab_size=CODEBOOK + 1024,
        intermediate_size=40,
        num_hidden_layers=3,
        rope_theta=1_000_000.0,
        rope_scaling={
            "rope_type": "default",
            "type": "default",
            "mrope_section": [2, 2, 2],
            "interleaved": True,
            "mrope_interleaved": True,
        },
        moe_intermediate_size=24,
        shared_expert_intermediate_size=36,
        num_experts=6,
        num_experts_per_tok=3,
        norm_topk_prob=False,
    )
    talker["code_predictor_config"].update(
        **layer,
        vocab_size=CODEBOOK,
        intermediate_size=56,
        num_hidden_layers=2,
        rope_theta=10000.0,
        num_code_groups=GROUPS,
    )
    root["code2wav_config"].update(
        codebook_size=CODEBOOK,
        num_quantizers=GROUPS,
        hidden_size=40,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=6,
        decoder_dim=48,
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        rope_theta=5000.0,
    )
    return root


def margins(scores) -> torch.Tensor:
    top = torch.stack([s[0].float().topk(2).values for s in scores])
    return top[:, 0] - top[:, 1]


def install_hooks(model, record: dict) -> None:
    """A greedy code predictor, and what the talker and code2wav saw, kept in ``record``."""
    predictor = model.talker.code_predictor
    predictor_generate = predictor.generate

    def greedy_predictor(*args, **kwargs):
        kwargs.update(do_sample=False, top_k=None, top_p=None, output_scores=True)
        kwargs["return_dict_in_generate"] = True
        result = predictor_generate(*args, **kwargs)
        record["predictor_margins"].append(margins(result.scores))
        return result

    predictor.generate = greedy_predictor
    talker_generate = model.talker.generate

    def talker_recorded(*args, **kwargs):
        kwargs["output_scores"] = True
        kwargs["output_logits"] = True
        result = talker_generate(*args, **kwargs)
        record["code0"] = result.sequences[0].clone()
        record["code0_margins"] = margins(result.scores)
        record["code0_logits"] = torch.stack([step[0].float() for step in result.logits])
        return result

    model.talker.generate = talker_recorded
    chunked_decode = model.code2wav.chunked_decode

    def decode_recorded(codes, **kwargs):
        record["codes"] = codes[0].t().clone()  # [G, F] -> [F, G]
        record["wav"] = model.code2wav(codes)[0, 0].clone()
        return chunked_decode(codes, **kwargs)

    model.code2wav.chunked_decode = decode_recorded


def speak(model, inputs, speaker: str, record: dict, thinker_tokens: int, talker_tokens: int):
    """One greedy spoken answer: the tensors a case records (see the module docstring)."""
    record.clear()
    record["predictor_margins"] = []
    model.thinker.rope_deltas = None
    model.talker.rope_deltas = None
    with torch.no_grad():
        thinker_result, wav_generate = model.generate(
            **inputs,
            speaker=speaker,
            return_audio=True,
            thinker_max_new_tokens=thinker_tokens,
            thinker_do_sample=False,
            thinker_output_scores=True,
            talker_do_sample=False,
            talker_max_new_tokens=talker_tokens,
        )
    return {
        "generated_ids": thinker_result.sequences[0, inputs["input_ids"].shape[1] :],
        "thinker_margins": margins(thinker_result.scores),
        "codes": record["codes"].long(),
        "code0": record["code0"].long(),
        "code0_margins": record["code0_margins"],
        "code0_logits": record["code0_logits"],
        "predictor_margins": torch.stack(record["predictor_margins"]),
        "wav": record["wav"].float(),
        "wav_generate": wav_generate.reshape(-1).float(),
    }


def speak_bf16(
    ckpt: Path, ref: Path, attn: str, case_inputs: list, thinker_tokens: int, talker_tokens: int
) -> dict:
    """Every case again, the checkpoint loaded as ``from_pretrained(dtype=bfloat16)``.

    Writes ``ref/bf16/CASE.safetensors`` (the same tensors, float32 / int64);
    returns the manifest's ``bf16`` entry: per case the thinker's tokens, the
    frame count and whether the talker ended on its EOS.
    """
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.bfloat16, attn_implementation=attn
    ).eval()
    record: dict = {}
    install_hooks(model, record)
    eos = model.config.talker_config.codec_eos_token_id
    out = ref / "bf16"
    out.mkdir(parents=True, exist_ok=True)
    cases = {}
    for name, speaker, inputs32 in case_inputs:
        # As the release's model card does (BatchFeature.to casts in place: a copy first).
        inputs = type(inputs32)(dict(inputs32)).to(model.dtype)
        tensors = speak(model, inputs, speaker, record, thinker_tokens, talker_tokens)
        save_file(
            {
                k: (v if not v.is_floating_point() else v.float()).contiguous()
                for k, v in tensors.items()
            },
            str(out / f"{name}.safetensors"),
        )
        cases[name] = {
            "generated_ids": tensors["generated_ids"].tolist(),
            "frames": int(tensors["codes"].shape[0]),
            "talker_stopped_on_eos": bool(tensors["code0"][-1] == eos),
        }
    return {"parameter_dtype": str(model.dtype).removeprefix("torch."), "cases": cases}


def main() -> None:
    out, request_path = Path(sys.argv[1]), Path(sys.argv[2])
    request = json.loads(request_path.read_text())
    seed = int(request.get("seed", 3))
    thinker_tokens = int(request.get("thinker_max_new_tokens", 12))
    talker_tokens = int(request.get("talker_max_new_tokens", 31))
    attn = request.get("attn_implementation", "sdpa")
    images_spec = request.get("images", DEFAULT_IMAGES)
    audios_spec = request.get("audios", DEFAULT_AUDIOS)
    cases = request.get("cases", DEFAULT_CASES)
    tool = mk.load_tool()

    ckpt, ref, inputs_dir = out / "ckpt", out / "ref", out / "ref" / "inputs"
    for path in (ckpt, ref):
        if path.exists():
            shutil.rmtree(path)
    inputs_dir.mkdir(parents=True)
    ckpt.mkdir(parents=True)

    tool.write_tokenizer_files(ckpt)
    (ckpt / "preprocessor_config.json").write_text(json.dumps(tool.preprocessor_config(), indent=1))
    processor = Qwen3OmniMoeProcessor.from_pretrained(ckpt)
    if not type(processor.image_processor).__name__.endswith("Fast"):
        raise SystemExit(
            f"expected 4.57.3's default fast image processor, got "
            f"{type(processor.image_processor).__name__} (is torchvision importable?)"
        )

    torch.manual_seed(seed)
    config = Qwen3OmniMoeConfig(**speech_config(tool))
    config._attn_implementation = attn
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    model.set_attn_implementation(attn)
    mk.randomise(model, seed + 1)
    c2w.randomise(model.code2wav, seed + 2)
    model.save_pretrained(
        ckpt, safe_serialization=True, max_shard_size=request.get("max_shard_size", "10MB")
    )
    processor.save_pretrained(ckpt)
    (ckpt / "preprocessor_config.json").write_text(
        json.dumps(tool.preprocessor_config(), indent=2, sort_keys=True) + "\n"
    )
    (ckpt / "chat_template.json").unlink()
    (ckpt / "generation_config.json").write_text(
        json.dumps(tool.generation_config(), indent=2) + "\n"
    )

    images: dict[str, Image.Image] = {}
    for k, (name, (height, width)) in enumerate(sorted(images_spec.items())):
        Image.fromarray(mk.synthetic_image(height, width, seed + 10 + k)).save(
            inputs_dir / f"{name}.png"
        )
        images[name] = Image.open(inputs_dir / f"{name}.png").convert("RGB")
    audios = {}
    for k, (name, seconds) in enumerate(sorted(audios_spec.items())):
        soundfile.write(
            inputs_dir / f"{name}.wav",
            mk.synthetic_audio(seconds, seed + 20 + k),
            mk.SAMPLE_RATE,
            subtype="PCM_16",
        )
        audios[name], rate = soundfile.read(inputs_dir / f"{name}.wav", dtype="float32")
        assert rate == mk.SAMPLE_RATE

    record: dict = {}
    install_hooks(model, record)

    eos = config.talker_config.codec_eos_token_id
    manifest_cases = []
    case_inputs = []  # (name, speaker, processor output) for the bf16 run
    for case in cases:
        name, messages, speaker = case["name"], case["messages"], case["speaker"]
        image_names = mk.media_in_order(messages, "image")
        audio_names = mk.media_in_order(messages, "audio")
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(
            text=prompt,
            images=[images[n] for n in image_names] or None,
            audio=[audios[n] for n in audio_names] or None,
            return_tensors="pt",
        )
        input_ids = inputs["input_ids"]
        case_inputs.append((name, speaker, inputs))
        tensors = speak(model, inputs, speaker, record, thinker_tokens, talker_tokens)
        generated, codes, code0 = tensors["generated_ids"], tensors["codes"], tensors["code0"]
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(ref / f"{name}.safetensors"))
        tokens = generated.tolist()
        manifest_cases.append(
            {
                "name": name,
                "speaker": speaker,
                "messages": messages,
                "images": [f"inputs/{n}.png" for n in image_names],
                "audios": [f"inputs/{n}.wav" for n in audio_names],
                "prompt": prompt,
                "input_ids": input_ids[0].tolist(),
                "generated_ids": tokens,
                "text": processor.tokenizer.decode(tokens, skip_special_tokens=True),
                "thinker_stopped_on_eos": bool(tokens and tokens[-1] == IM_END),
                "frames": int(codes.shape[0]),
                "samples": int(record["wav"].numel()),
                "talker_stopped_on_eos": bool(code0[-1] == eos),
                "distinct_code0": len(set(code0.tolist())),
                "min_thinker_margin": float(tensors["thinker_margins"].min()),
                "min_code0_margin": float(tensors["code0_margins"].min()),
                "min_predictor_margin": float(tensors["predictor_margins"].min()),
                "wav_rms": float(record["wav"].pow(2).mean().sqrt()),
                "wav_clipped": int((record["wav"].abs() >= 1.0).sum()),
            }
        )

    import transformers

    manifest = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": attn,
        "seed": seed,
        "thinker_max_new_tokens": thinker_tokens,
        "talker_max_new_tokens": talker_tokens,
        "checkpoint": "ckpt",
        "cases": manifest_cases,
    }
    if request.get("bf16"):
        manifest["bf16"] = speak_bf16(ckpt, ref, attn, case_inputs, thinker_tokens, talker_tokens)
    (ref / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
