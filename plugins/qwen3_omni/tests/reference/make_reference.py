"""Write a tiny Qwen3-Omni checkpoint with transformers' own classes and record its outputs.

Runs inside the reference environment (transformers 4.57.3, whose
``qwen3_omni_moe`` is the reference), never inside omni's. Usage::

    python make_reference.py OUT_DIR REQUEST.json

The model is built from a config that deliberately differs from our ``tiny``
preset (thinker width 48, 3 layers, 6 experts top-3, head_dim 16 with
``mrope_section`` [3, 3, 2]; audio tower width 48, 2 layers; vision tower
depth 3, width 48, deepstack after blocks 0 and 2), so parity cannot come from
shared constants. Its tensors get seeded values with O(1) activations (the
library's own init is too small for greedy decoding to do anything but repeat
a token). The tokenizer, chat template and preprocessor files come from
``tools/make_tiny_preset.py``; the processor is loaded from those files.

Request (JSON; every key optional)::

    {"max_new_tokens": 32, "seed": 2, "attn_implementation": "sdpa",
     "max_shard_size": "10MB",
     "images": {"NAME": [height, width], ...},   # synthetic RGB images
     "audios": {"NAME": seconds, ...},           # synthetic 16 kHz clips
     "cases": [{"name": str, "messages": [...]}, ...],
     "bf16": false}                              # also run every case in bf16

With ``"bf16": true`` the saved checkpoint is also loaded in bfloat16 and every
case run again (``bf16_record.py`` says what it records, under ``ref/bf16/``).

Messages use omni's internal form (see ``omni_qwen3_omni.chat``); a media part
names its input: ``{"type": "image", "image": "NAME"}`` /
``{"type": "audio", "audio": "NAME"}``. Defaults: the five cases in
``DEFAULT_CASES`` (text; text + image; text + two images of different sizes;
text + audio; text + image + audio).

Notes: the processor is the library's own ``Qwen3OmniMoeProcessor`` as
``from_pretrained`` builds it, so images go through 4.57.3's default image
processor, the torchvision "fast" one (``Qwen2VLImageProcessorFast``; the PIL
one differs from it by up to 0.055). A CPU-only torch cannot load the C++
extension of a CUDA torchvision wheel, and torchvision's
``_meta_registrations`` then fails at import; that module only registers
shape functions for torchvision's own C++ ops (nms, roi_align, ...), which
resizing never calls, so it is replaced by an empty module before import (as
in ``vision_reference.py``). The manifest records the image processor class.
Under sdpa/eager the audio tower attends over the whole
clip (its windowed attention exists only for flash-attention-2); the default
2.3 s clip (230 mel frames, two full 100-frame chunks and a partial one) fits
one 800-frame window, so this equals the release's windowed behaviour. The
default seed (2) keeps every greedy step's top-1/top-2 logit margin above
3e-3, so float32 implementations cannot flip a token on a near-tie.

Output layout (``OUT_DIR``)::

    ckpt/                    the checkpoint, as save_pretrained writes it:
      config.json, generation_config.json,
      model-0000K-of-0000N.safetensors + model.safetensors.index.json (sharded),
      vocab.json, merges.txt, tokenizer.json, tokenizer_config.json,
      special_tokens_map.json, added_tokens.json, chat_template.jinja,
      preprocessor_config.json (feature extractor + image processor merged)
      video_preprocessor_config.json (as the processor's save_pretrained writes it)
    ref/
      manifest.json          versions, settings, and per case: name, messages,
                             image / audio input file names (in prompt order),
                             image_grid_thw, image_token_counts,
                             audio_mel_frames, audio_token_counts, prompt
                             (rendered text, one pad per medium), input_ids,
                             generated_ids (new tokens only, greedy),
                             stopped_on_eos, min_margin (smallest top-1 minus
                             top-2 logit over the greedy steps)
      inputs/NAME.png        8-bit RGB, exactly the pixels the processor saw
      inputs/NAME.wav        16 kHz mono PCM-16; the processor saw
                             soundfile.read(dtype="float32") of this file
      CASE.safetensors       float32 / int64 tensors of one case:
        input_ids [T]                 prompt ids (media pads expanded)
        generated_ids [G]             greedy continuation
        generated_margins [G]         top-1 minus top-2 logit at each greedy step
                                      (a mismatch at a tiny margin is a near-tie)
        position_ids [3, T], rope_deltas [1]   the thinker's M-RoPE positions
        thinker_hidden_states [L+1, T, H]      from forward(output_hidden_states):
                               [0] embeddings after the media merge; [i] for
                               0 < i < L the output of layer i-1 (deepstack
                               additions already applied in place); [L] the
                               last layer's output after the final norm
        thinker_last_logits [V]       logits at the last prompt position
        with audio:  input_features [128, F] (valid frames only),
                     audio_embeds [N_audio, H] (audio tower, all clips in order)
        with images: pixel_values [P, 1536], image_grid_thw [n, 3],
                     image_embeds [N_image, H] (vision tower, all images),
                     deepstack_K [N_image, H] for K = 0.. (one per deepstack index)
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)


# Before transformers imports torchvision: see the module docstring.
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("_stub"))

import soundfile  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    Qwen3OmniMoeProcessor,
)

TOOL = Path(__file__).resolve().parents[2] / "tools" / "make_tiny_preset.py"
SAMPLE_RATE = 16000

DEFAULT_IMAGES = {"wide": [64, 96], "tall": [120, 80]}
DEFAULT_AUDIOS = {"clip": 2.3}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
DEFAULT_CASES = [
    {"name": "text", "messages": [SYSTEM, {"role": "user", "content": "Tell me the weather."}]},
    {
        "name": "image",
        "messages": [
            SYSTEM,
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "wide"},
                    {"type": "text", "text": "What is in this picture?"},
                ],
            },
        ],
    },
    {
        "name": "two_images",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare the first"},
                    {"type": "image", "image": "wide"},
                    {"type": "text", "text": " with the second"},
                    {"type": "image", "image": "tall"},
                ],
            }
        ],
    },
    {
        "name": "audio",
        "messages": [
            SYSTEM,
            {
                "role": "user",
                "content": [
                    {"type": "audio", "audio": "clip"},
                    {"type": "text", "text": "Transcribe the audio."},
                ],
            },
        ],
    },
    {
        "name": "image_audio",
        "messages": [
            SYSTEM,
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": "tall"},
                    {"type": "audio", "audio": "clip"},
                    {"type": "text", "text": "Describe both."},
                ],
            },
        ],
    },
]


def load_tool():
    spec = importlib.util.spec_from_file_location("omni_qwen3_omni_preset_tool", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_config(tool) -> dict:
    """Widths, depths and expert counts unlike the tiny preset's."""
    return tool.model_config(
        hidden=48,
        layers=3,
        heads=4,
        kv_heads=2,
        head_dim=16,
        mrope_section=(3, 3, 2),
        experts=6,
        top_k=3,
        moe_intermediate=24,
        audio_d_model=48,
        audio_layers=2,
        audio_heads=3,
        audio_downsample=8,
        vision_depth=3,
        vision_hidden=48,
        vision_heads=3,
        vision_positions=576,
        deepstack=(0, 2),
        accept_hidden_layer=2,
    )


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Seeded values with O(1) activations for every floating tensor."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(module.state_dict().items()):
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=gen)
            if tensor.dim() <= 1:
                value = 0.1 * noise + (1.0 if name.endswith(".weight") else 0.0)
            elif "embed" in name:
                value = noise
            else:
                value = noise / math.sqrt(max(tensor[0].numel(), 1))
            tensor.copy_(value)


def synthetic_image(height: int, width: int, seed: int) -> np.ndarray:
    """Gradients plus seeded noise, uint8 RGB."""
    y = np.linspace(0.0, 1.0, height)[:, None]
    x = np.linspace(0.0, 1.0, width)[None, :]
    base = np.stack([y * np.ones_like(x), x * np.ones_like(y), 0.5 + 0.5 * np.sin(6 * x + 4 * y)])
    noise = np.random.default_rng(seed).normal(0.0, 0.15, size=(3, height, width))
    return (np.clip(base + noise, 0.0, 1.0) * 255).round().astype(np.uint8).transpose(1, 2, 0)


def synthetic_audio(seconds: float, seed: int) -> np.ndarray:
    """A deterministic, speech-like clip: gliding harmonics under a syllable envelope."""
    t = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.1 * t) ** 2
    noise = np.random.default_rng(seed).normal(0.0, 0.02, size=t.shape)
    return (0.25 * envelope * voice + noise).astype(np.float32)


def audio_token_count(frames: int) -> int:
    """The processor's per-clip count (as in processing_qwen3_omni_moe)."""
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
        _get_feat_extract_output_lengths,
    )

    return int(_get_feat_extract_output_lengths(torch.tensor([frames]))[0])


def media_in_order(messages: list, kind: str) -> list[str]:
    names = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            names += [part[kind] for part in content if part.get("type") == kind]
    return names


def main() -> None:
    out, request_path = Path(sys.argv[1]), Path(sys.argv[2])
    request = json.loads(request_path.read_text())
    seed = int(request.get("seed", 2))
    max_new = int(request.get("max_new_tokens", 32))
    attn = request.get("attn_implementation", "sdpa")
    images_spec = request.get("images", DEFAULT_IMAGES)
    audios_spec = request.get("audios", DEFAULT_AUDIOS)
    cases = request.get("cases", DEFAULT_CASES)
    tool = load_tool()

    ckpt, ref, inputs_dir = out / "ckpt", out / "ref", out / "ref" / "inputs"
    for path in (ckpt, ref):
        if path.exists():
            shutil.rmtree(path)
    inputs_dir.mkdir(parents=True)
    ckpt.mkdir(parents=True)

    # Tokenizer / template / preprocessor files first: the processor loads from them.
    tool.write_tokenizer_files(ckpt)
    (ckpt / "preprocessor_config.json").write_text(json.dumps(tool.preprocessor_config(), indent=1))
    processor = Qwen3OmniMoeProcessor.from_pretrained(ckpt)
    if not type(processor.image_processor).__name__.endswith("Fast"):
        raise SystemExit(
            f"expected 4.57.3's default fast image processor, got "
            f"{type(processor.image_processor).__name__} (is torchvision importable?)"
        )

    torch.manual_seed(seed)
    config = Qwen3OmniMoeConfig(**reference_config(tool))
    config._attn_implementation = attn
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    model.set_attn_implementation(attn)
    randomise(model, seed + 1)
    model.save_pretrained(
        ckpt, safe_serialization=True, max_shard_size=request.get("max_shard_size", "10MB")
    )
    processor.save_pretrained(ckpt)
    # Both sub-processors write preprocessor_config.json; the release merges them.
    (ckpt / "preprocessor_config.json").write_text(
        json.dumps(tool.preprocessor_config(), indent=2, sort_keys=True) + "\n"
    )
    # save_pretrained wrote chat_template.jinja; keep exactly its layout.
    (ckpt / "chat_template.json").unlink()
    (ckpt / "generation_config.json").write_text(
        json.dumps(tool.generation_config(), indent=2) + "\n"
    )

    images: dict[str, Image.Image] = {}
    for k, (name, (height, width)) in enumerate(sorted(images_spec.items())):
        Image.fromarray(synthetic_image(height, width, seed + 10 + k)).save(
            inputs_dir / f"{name}.png"
        )
        images[name] = Image.open(inputs_dir / f"{name}.png").convert("RGB")
    audios: dict[str, np.ndarray] = {}
    for k, (name, seconds) in enumerate(sorted(audios_spec.items())):
        soundfile.write(
            inputs_dir / f"{name}.wav",
            synthetic_audio(seconds, seed + 20 + k),
            SAMPLE_RATE,
            subtype="PCM_16",
        )
        audios[name], rate = soundfile.read(inputs_dir / f"{name}.wav", dtype="float32")
        assert rate == SAMPLE_RATE

    thinker = model.thinker
    manifest_cases = []
    case_inputs = []  # (name, processor output) for the bf16 run
    for case in cases:
        name, messages = case["name"], case["messages"]
        image_names, audio_names = (
            media_in_order(messages, "image"),
            media_in_order(messages, "audio"),
        )
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(
            text=prompt,
            images=[images[n] for n in image_names] or None,
            audio=[audios[n] for n in audio_names] or None,
            return_tensors="pt",
        )
        case_inputs.append((name, inputs))
        input_ids = inputs["input_ids"]
        record: dict[str, torch.Tensor] = {"input_ids": input_ids[0]}
        entry: dict = {
            "name": name,
            "messages": messages,
            "images": [f"inputs/{n}.png" for n in image_names],
            "audios": [f"inputs/{n}.wav" for n in audio_names],
            "prompt": prompt,
            "image_grid_thw": [],
            "image_token_counts": [],
            "audio_mel_frames": [],
            "audio_token_counts": [],
        }
        with torch.no_grad():
            if image_names:
                grid = inputs["image_grid_thw"]
                merge = processor.image_processor.merge_size
                entry["image_grid_thw"] = grid.tolist()
                entry["image_token_counts"] = [int(g.prod()) // (merge * merge) for g in grid]
                embeds, deepstack = thinker.get_image_features(inputs["pixel_values"], grid)
                record.update(
                    pixel_values=inputs["pixel_values"], image_grid_thw=grid, image_embeds=embeds
                )
                for k, extra in enumerate(deepstack):
                    record[f"deepstack_{k}"] = extra
            if audio_names:
                mask = inputs["feature_attention_mask"]
                frames = [int(n) for n in mask.sum(-1)]
                entry["audio_mel_frames"] = frames
                entry["audio_token_counts"] = [audio_token_count(n) for n in frames]
                valid = inputs["input_features"].permute(0, 2, 1)[mask.bool()]
                record["input_features"] = valid.T
                record["audio_embeds"] = thinker.get_audio_features(
                    inputs["input_features"], feature_attention_mask=mask
                )
            ids = input_ids[0].tolist()
            assert ids.count(thinker.config.image_token_id) == sum(entry["image_token_counts"])
            assert ids.count(thinker.config.audio_token_id) == sum(entry["audio_token_counts"])

            position_ids, rope_deltas = thinker.get_rope_index(
                input_ids,
                inputs.get("image_grid_thw"),
                None,
                inputs["attention_mask"],
                False,
                inputs["feature_attention_mask"].sum(-1) if audio_names else None,
                None,
            )
            forward = thinker(**inputs, output_hidden_states=True)
            record["position_ids"] = position_ids[:, 0]
            record["rope_deltas"] = rope_deltas.reshape(-1)
            record["thinker_hidden_states"] = torch.stack([h[0] for h in forward.hidden_states])
            record["thinker_last_logits"] = forward.logits[0, -1]

            thinker.rope_deltas = None
            result, _ = model.generate(
                **inputs,
                return_audio=False,
                thinker_max_new_tokens=max_new,
                thinker_do_sample=False,
                thinker_return_dict_in_generate=True,
                thinker_output_scores=True,
            )
        generated = result.sequences[0, input_ids.shape[1] :]
        record["generated_ids"] = generated
        top2 = torch.stack([step[0].topk(2).values for step in result.scores])
        record["generated_margins"] = top2[:, 0] - top2[:, 1]
        tokens = generated.tolist()
        if len(set(tokens)) < 4 and len(tokens) >= 8:
            raise SystemExit(
                f"case {name}: degenerate greedy output {tokens}; raise the init scale"
            )
        entry.update(
            input_ids=ids,
            generated_ids=tokens,
            stopped_on_eos=bool(tokens and tokens[-1] == 151645),
            min_margin=float(record["generated_margins"].min()),
        )
        integer = {"input_ids", "generated_ids", "position_ids", "rope_deltas", "image_grid_thw"}
        save_file(
            {
                k: v.detach().to(torch.int64 if k in integer else torch.float32).contiguous()
                for k, v in record.items()
            },
            str(ref / f"{name}.safetensors"),
        )
        manifest_cases.append(entry)

    import transformers

    manifest = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": attn,
        "image_processor": type(processor.image_processor).__name__,
        "seed": seed,
        "max_new_tokens": max_new,
        "checkpoint": "ckpt",
        "cases": manifest_cases,
    }
    if request.get("bf16"):
        from bf16_record import record_bf16

        manifest["bf16"] = record_bf16(ckpt, ref, model, attn, max_new, case_inputs)
    (ref / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
