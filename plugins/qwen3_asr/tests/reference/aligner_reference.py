"""Record the release's forced aligner (Qwen3-ForcedAligner, qwen-asr 0.0.6) on given clips.

Runs inside the reference environment. Usage: ``python aligner_reference.py OUT_DIR``.
Reads ``OUT_DIR/request.json`` (the aligner's tiny config, the preset with the
tokenizer files, the seed, the cases) and ``OUT_DIR/inputs.npz`` (float32 16 kHz
clips). Writes ``OUT_DIR/aligner/`` (a tiny checkpoint saved by the release's own
classes, seeded O(1) weights) and ``OUT_DIR/aligned.json``: per case the input ids
the release feeds its model and ``Qwen3ForcedAligner.align``'s items (text, start
and end in seconds). The audio tower runs with the reference's own block mask.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.modules.setdefault("torchvision", None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from asr_reference import TOKENIZER_FILES, randomise, with_block_masks  # noqa: E402
from qwen_asr.core.transformers_backend import (  # noqa: E402
    Qwen3ASRConfig,
    Qwen3ASRForConditionalGeneration,
    Qwen3ASRProcessor,
)
from qwen_asr.inference.qwen3_forced_aligner import (  # noqa: E402
    Qwen3ForceAlignProcessor,
    Qwen3ForcedAligner,
)


def main() -> None:
    out = Path(sys.argv[1])
    request = json.loads((out / "request.json").read_text())
    torch.set_num_threads(1)
    clips = dict(np.load(out / "inputs.npz"))
    config = Qwen3ASRConfig(**request["config"])
    model = Qwen3ASRForConditionalGeneration(config).eval().float()
    randomise(model, request["seed"])
    ckpt = out / "aligner"
    model.save_pretrained(ckpt)
    # save_pretrained writes the thinker's class-level model_type; the release's
    # aligner config names itself (its head size depends on it), as ours must read it.
    saved = json.loads((ckpt / "config.json").read_text())
    saved["thinker_config"]["model_type"] = request["config"]["thinker_config"]["model_type"]
    (ckpt / "config.json").write_text(json.dumps(saved, indent=1))
    for name in TOKENIZER_FILES:
        shutil.copy(Path(request["preset"]) / name, ckpt / name)
    processor = Qwen3ASRProcessor.from_pretrained(ckpt)
    model = Qwen3ASRForConditionalGeneration.from_pretrained(ckpt, attn_implementation="sdpa")
    model = model.eval().float()
    with_block_masks(model.thinker.audio_tower)
    aligner = Qwen3ForcedAligner(model, processor, Qwen3ForceAlignProcessor())
    cases = []
    for case in request["cases"]:
        clip = clips[case["clip"]]
        _, text = aligner.aligner_processor.encode_timestamp(case["text"], case["language"])
        ids = processor(text=[text], audio=[clip], return_tensors="pt")["input_ids"][0]
        (result,) = aligner.align(audio=(clip, 16000), text=case["text"], language=case["language"])
        items = [[it.text, it.start_time, it.end_time] for it in result.items]
        cases.append({"ids": ids.tolist(), "items": items})
    (out / "aligned.json").write_text(json.dumps(cases))


if __name__ == "__main__":
    main()
