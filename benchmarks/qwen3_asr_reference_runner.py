"""The reference side of ``bench_qwen3_asr.py``: qwen-asr 0.0.6's transformers backend.

Runs in the reference environment (``make qwen-asr-reference-env``), never in
omni's. Usage: ``python qwen3_asr_reference_runner.py OUT_DIR``, with
``OUT_DIR/request.json`` (config, preset with the tokenizer files, seed,
``new_tokens``, ``threads``, ``batch``) and ``OUT_DIR/clips.npz`` (float32 16 kHz).

Writes ``OUT_DIR/ckpt`` (the model, seeded O(1) weights, saved by the release's
own ``save_pretrained``: the benchmark's other side loads these same weights)
and ``OUT_DIR/timings.json``: wall seconds to transcribe every clip one at a
time (``Qwen3ASRModel.transcribe`` per clip) and in batches of ``batch``
(``max_inference_batch_size``), greedy, ``new_tokens`` tokens at most.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path

sys.modules.setdefault("torchvision", None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from qwen_asr.core.transformers_backend import (  # noqa: E402
    Qwen3ASRConfig,
    Qwen3ASRForConditionalGeneration,
    Qwen3ASRProcessor,
)
from qwen_asr.inference.qwen3_asr import Qwen3ASRModel  # noqa: E402

FILES = (
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "chat_template.json",
    "preprocessor_config.json",
)


def main() -> None:
    out = Path(sys.argv[1])
    request = json.loads((out / "request.json").read_text())
    torch.set_num_threads(request["threads"])
    clips = [c for _, c in sorted(np.load(out / "clips.npz").items())]
    model = Qwen3ASRForConditionalGeneration(Qwen3ASRConfig(**request["config"])).eval().float()
    gen = torch.Generator().manual_seed(request["seed"])
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            if tensor.dim() == 1:
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=gen))
                tensor.add_(1.0 if "norm" in name and name.endswith("weight") else 0.0)
            else:
                tensor.copy_(
                    torch.randn(tensor.shape, generator=gen) / math.sqrt(tensor[0].numel())
                )
    ckpt = out / "ckpt"
    model.save_pretrained(ckpt)
    for name in FILES:
        shutil.copy(Path(request["preset"]) / name, ckpt / name)
    processor = Qwen3ASRProcessor.from_pretrained(ckpt)
    timings = {}
    for label, batch in (("one", 1), ("batch", request["batch"])):
        asr = Qwen3ASRModel(
            "transformers", model, processor, max_inference_batch_size=batch,
            max_new_tokens=request["new_tokens"],
        )  # fmt: skip
        asr.transcribe(audio=[(clips[0], 16000)])  # warm-up
        started = time.perf_counter()
        if batch == 1:
            for clip in clips:
                asr.transcribe(audio=[(clip, 16000)])
        else:
            asr.transcribe(audio=[(clip, 16000) for clip in clips])
        timings[label] = time.perf_counter() - started
    (out / "timings.json").write_text(json.dumps(timings))


if __name__ == "__main__":
    main()
