"""Write a tiny checkpoint with the reference implementation and record its greedy output.

Runs inside the reference environment (``qwen-tts`` + transformers 4.57.3),
never inside omni's: see ``tests/REFERENCE.md``. Usage::

    python make_reference.py PRESET_DIR OUT_DIR REQUEST.json

The request names the variant and the prompt as token ids (tokenised by our
tokenizer, so both sides see identical ids). The script builds the reference
model from the preset's configs, gives every tensor seeded random values,
saves it with ``save_pretrained`` (the real layout), runs greedy generation
and the codec decode, and writes ``OUT_DIR/reference_outputs.npz``.

``"dtype": "bfloat16"`` in the request runs the talker in bf16 (the checkpoint
is saved in float32 first, then cast as ``from_pretrained`` in bf16 would).
Every run records codebook 0's raw logits and processed scores at each step
(``logits``, ``scores``: what greedy decoding took the argmax of).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

# The reference environment also serves Qwen3-Omni's image processor, which needs
# torchvision; Qwen3-TTS needs none, and a torchvision built for another torch
# breaks transformers' imports, so this script hides it.
sys.modules.setdefault("torchvision", None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model  # noqa: E402
from qwen_tts.core.models import (  # noqa: E402
    Qwen3TTSConfig,
    Qwen3TTSForConditionalGeneration,
)


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Seeded values with O(1) activations (the reference's own init zeroes the codebooks)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(module.state_dict().items()):
            if not tensor.is_floating_point():
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("cluster_usage", "initialized"):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=gen))
            elif leaf in ("alpha", "beta", "bias", "scale", "gamma") or tensor.dim() == 1:
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=gen))
                if "norm" in name and leaf == "weight":
                    tensor.add_(1.0)
            elif "embed" in name:
                tensor.copy_(torch.randn(tensor.shape, generator=gen))
            else:
                fan_in = max(tensor[0].numel(), 1)
                gain = 0.25 if name.endswith("conv2.conv.weight") else 1.0
                if name.startswith("decoder.decoder.") and tensor.shape[0] == 1:
                    gain = 0.05
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * gain / math.sqrt(fan_in))


def main() -> None:
    preset, out, request_path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    request = json.loads(request_path.read_text())
    variant = request["variant"]
    torch.manual_seed(0)

    cfg = json.loads((preset / "config.json").read_text())
    cfg["tts_model_type"] = variant
    config = Qwen3TTSConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    model = Qwen3TTSForConditionalGeneration(config).eval()
    randomise(model, 1)
    model.save_pretrained(out, safe_serialization=True)

    st_cfg = json.loads((preset / "speech_tokenizer" / "config.json").read_text())
    st_config = Qwen3TTSTokenizerV2Config(**{k: v for k, v in st_cfg.items() if k != "model_type"})
    speech = Qwen3TTSTokenizerV2Model(st_config).eval()
    randomise(speech, 2)
    speech.save_pretrained(out / "speech_tokenizer", safe_serialization=True)
    for name in ("generation_config.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(preset / name, out / name)
    steps: dict[str, list] = {}
    if request.get("dtype", "float32") == "bfloat16":
        # As from_pretrained(dtype=bfloat16) leaves it (its config round trip fails in
        # qwen-tts 0.1.1): weights in bf16, rotary tables computed in float32 (a plain
        # .to(bfloat16) rounds them too, which moves every position).
        model = model.to(torch.bfloat16)
        for sub in model.modules():
            if hasattr(sub, "rope_init_fn") and hasattr(sub, "inv_freq"):
                inv_freq, _ = sub.rope_init_fn(sub.config, sub.inv_freq.device)
                sub.inv_freq = inv_freq
                sub.original_inv_freq = inv_freq

    results: dict[str, np.ndarray] = {}
    ids = [torch.tensor([request["text_ids"]])]
    kwargs = dict(
        input_ids=ids,
        languages=[request.get("language", "auto")],
        non_streaming_mode=request.get("non_streaming", False),
        max_new_tokens=request["max_new_tokens"],
        do_sample=False,
        subtalker_dosample=False,
        repetition_penalty=request.get("repetition_penalty", 1.05),
    )
    plain = model.talker.generate

    def recording(**kw):
        result = plain(**kw, output_logits=True, output_scores=True)
        steps["logits"] = [x[0].float() for x in result.logits]
        steps["scores"] = [x[0].float() for x in result.scores]
        return result

    model.talker.generate = recording
    ref_codes = None
    with torch.no_grad():
        if variant == "custom_voice":
            kwargs["speakers"] = [request["speaker"]]
        elif variant == "base":
            wav = np.load(request["ref_wav"]).astype(np.float32)
            enc = speech.encode(
                torch.from_numpy(wav)[None], torch.ones(1, wav.shape[0], dtype=torch.long)
            )
            ref_codes = enc.audio_codes[0]
            xvector = model.extract_speaker_embedding(audio=wav, sr=24000)
            results["ref_codes"] = ref_codes.numpy()
            results["xvector"] = xvector.float().numpy()
            icl = not request.get("x_vector_only", False)
            kwargs["voice_clone_prompt"] = {
                "ref_code": [ref_codes if icl else None],
                "ref_spk_embedding": [xvector],
                "x_vector_only_mode": [not icl],
                "icl_mode": [icl],
            }
            kwargs["ref_ids"] = [torch.tensor([request["ref_ids"]]) if icl else None]
            if not icl:
                ref_codes = None
        codes_list, _ = model.generate(**kwargs)
        codes = codes_list[0]
        full = codes if ref_codes is None else torch.cat([ref_codes, codes])
        wav_out = speech.decode(full[None]).audio_values[0]
        if ref_codes is not None:
            cut = int(ref_codes.shape[0] / max(full.shape[0], 1) * wav_out.shape[0])
            wav_out = wav_out[cut:]
    results["codes"] = codes.numpy()
    for key, rows in steps.items():
        results[key] = torch.stack(rows).numpy()
    results["wav"] = wav_out.float().numpy()
    np.savez(out / "reference_outputs.npz", **results)


if __name__ == "__main__":
    main()
