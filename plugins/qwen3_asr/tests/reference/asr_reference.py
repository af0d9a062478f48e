"""Record the release's Qwen3-ASR on given clips (qwen-asr 0.0.6, transformers 4.57.6).

Runs inside the reference environment (``make qwen-asr-reference-env``), never
inside omni's. Usage::

    python asr_reference.py OUT_DIR

Reads ``OUT_DIR/request.json`` (the tiny config, the preset directory with the
tokenizer files, the seed, the cases) and ``OUT_DIR/inputs.npz`` (float32
16 kHz clips written by our test, so both sides hear the same samples).
Writes:

* ``OUT_DIR/ckpt/``: a tiny checkpoint saved by the release's own classes
  (``Qwen3ASRForConditionalGeneration.save_pretrained``, seeded O(1) weights),
  with the preset's tokenizer files and chat template beside it;
* ``OUT_DIR/reference.npz``: per case ``ids/<i>`` (the prompt ids the
  release's ``Qwen3ASRModel._build_text_prompt`` and processor make),
  ``mel/<i>`` (``input_features`` cut to the mask), ``audio/<i>`` (the tower's
  rows, ``get_audio_features``) and ``tokens/<i>`` (greedy ``generate``, the
  case alone); ``batch_tokens/<j>`` for the cases of ``request["batch"]``
  generated in one call.

The audio tower runs with the reference's own ``cu_seqlens`` block mask on
every layer (what its flash-attention path computes; its sdpa path has no
windows at all), so clips longer than one window compare with the windows the
release serves with.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

sys.modules.setdefault("torchvision", None)  # the audio path needs none

import numpy as np  # noqa: E402
import torch  # noqa: E402
from qwen_asr.core.transformers_backend import (  # noqa: E402
    Qwen3ASRConfig,
    Qwen3ASRForConditionalGeneration,
    Qwen3ASRProcessor,
)
from qwen_asr.inference.qwen3_asr import Qwen3ASRModel  # noqa: E402

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "chat_template.json")
TOKENIZER_FILES += ("preprocessor_config.json",)


def randomise(module: torch.nn.Module, seed: int) -> None:
    """Seeded values with O(1) activations (the library's own init is near-trivial)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(module.state_dict().items()):
            if tensor.dim() == 1:
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=gen))
                if "norm" in name and name.endswith("weight"):
                    tensor.add_(1.0)
            else:
                fan_in = tensor[0].numel()
                tensor.copy_(torch.randn(tensor.shape, generator=gen) / math.sqrt(fan_in))


def with_block_masks(tower: torch.nn.Module) -> None:
    """Give every tower layer the reference's own cu_seqlens block mask (its FA2 windows)."""
    for layer in tower.layers:
        plain = layer.forward

        def masked(hidden_states, cu_seqlens, attention_mask=None, _plain=plain, **kwargs):
            mask = tower._prepare_attention_mask(hidden_states, cu_seqlens)
            return _plain(hidden_states, cu_seqlens, attention_mask=mask, **kwargs)

        layer.forward = masked


def main() -> None:
    out = Path(sys.argv[1])
    request = json.loads((out / "request.json").read_text())
    torch.set_num_threads(1)
    clips = dict(np.load(out / "inputs.npz"))

    config = Qwen3ASRConfig(**request["config"])
    torch.manual_seed(request["seed"])
    model = Qwen3ASRForConditionalGeneration(config).eval().float()
    randomise(model, request["seed"])
    ckpt = out / "ckpt"
    model.save_pretrained(ckpt)
    preset = Path(request["preset"])
    for name in TOKENIZER_FILES:
        shutil.copy(preset / name, ckpt / name)
    processor = Qwen3ASRProcessor.from_pretrained(ckpt)
    model = Qwen3ASRForConditionalGeneration.from_pretrained(ckpt, attn_implementation="sdpa")
    model = model.eval().float()
    with_block_masks(model.thinker.audio_tower)
    asr = Qwen3ASRModel("transformers", model, processor, max_new_tokens=request["max_new_tokens"])

    results: dict[str, np.ndarray] = {}

    def inputs_for(cases: list[dict]) -> dict:
        prompts = [asr._build_text_prompt(c["context"], c["language"]) for c in cases]
        audio = [clips[c["clip"]] for c in cases]
        return processor(text=prompts, audio=audio, return_tensors="pt", padding=True)

    def greedy(inputs: dict) -> list[np.ndarray]:
        with torch.no_grad():
            got = model.generate(
                **inputs, max_new_tokens=request["max_new_tokens"], do_sample=False
            )
        start = inputs["input_ids"].shape[1]
        return [row[start:].numpy() for row in got.sequences]

    for i, case in enumerate(request["cases"]):
        inputs = inputs_for([case])
        results[f"ids/{i}"] = inputs["input_ids"][0].numpy()
        frames = int(inputs["feature_attention_mask"][0].sum())
        results[f"mel/{i}"] = inputs["input_features"][0, :, :frames].numpy()
        with torch.no_grad():
            rows = model.thinker.get_audio_features(
                inputs["input_features"], feature_attention_mask=inputs["feature_attention_mask"]
            )
        results[f"audio/{i}"] = rows.numpy()
        results[f"tokens/{i}"] = greedy(inputs)[0]
    batch = [request["cases"][i] for i in request["batch"]]
    for j, tokens in enumerate(greedy(inputs_for(batch))):
        results[f"batch_tokens/{j}"] = tokens
    np.savez(out / "reference.npz", **results)


if __name__ == "__main__":
    main()
