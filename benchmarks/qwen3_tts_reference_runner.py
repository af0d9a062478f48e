"""The reference's side of ``bench_qwen3_tts.py``: run inside the ``qwen-tts`` environment.

Usage: ``python qwen3_tts_reference_runner.py CHECKPOINT_DIR JOB.json`` with
the reference environment's python (transformers 4.57.3, see
``plugins/qwen3_tts/tests/REFERENCE.md``). It never imports omni.

It builds the reference model and codec from the checkpoint's configs and
loads *our* saved weights into them strictly (every tensor must match by
name and shape, so both sides compute with the same numbers), then generates
the job's requests one after another with the release's sampling defaults
and decodes each with the reference codec, as the release serves them. EOS
is banned until the frame count is reached (``min_new_tokens``) so both sides
make the same number of frames. One JSON line on stdout carries the timings.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

# The environment's torchvision (for Qwen3-Omni's image processor) is a build for
# another torch that breaks transformers' imports; Qwen3-TTS needs none (as in
# plugins/qwen3_tts/tests/reference/make_reference.py).
sys.modules.setdefault("torchvision", None)

import torch  # noqa: E402
from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model  # noqa: E402
from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers.modeling_utils import no_init_weights  # noqa: E402


def _config(path: Path, config_class: Any) -> Any:
    raw = json.loads(path.read_text())
    return config_class(**{k: v for k, v in raw.items() if k != "model_type"})


def _load_strict(module: torch.nn.Module, weights: Path) -> int:
    """Our tensors into the reference module; any mismatch is an error naming it."""
    state = load_file(str(weights))
    result = module.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    return len(state)


def _force_frames(model: Any, frames: int) -> None:
    """The release hard-codes ``min_new_tokens=2``; ban EOS until ``frames`` instead."""
    generate = model.talker.generate

    def patched(*args: Any, **kwargs: Any) -> Any:
        kwargs["min_new_tokens"] = frames
        return generate(*args, **kwargs)

    model.talker.generate = patched


def main() -> None:
    root, job = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    torch.set_num_threads(int(job["threads"]))
    torch.manual_seed(0)
    started = time.perf_counter()
    with no_init_weights():
        model = Qwen3TTSForConditionalGeneration(
            _config(root / "config.json", Qwen3TTSConfig)
        ).eval()
        codec = Qwen3TTSTokenizerV2Model(
            _config(root / "speech_tokenizer" / "config.json", Qwen3TTSTokenizerV2Config)
        ).eval()
    tensors = _load_strict(model, root / "model.safetensors")
    tensors += _load_strict(codec, root / "speech_tokenizer" / "model.safetensors")
    if job.get("dtype", "float32") == "bfloat16":
        # talker and codec, as the release's from_pretrained(dtype=...) casts both
        model, codec = model.to(torch.bfloat16), codec.to(torch.bfloat16)
        for sub in model.modules():  # rotary tables in float32, as from_pretrained leaves them
            if hasattr(sub, "rope_init_fn") and hasattr(sub, "inv_freq"):
                sub.inv_freq, _ = sub.rope_init_fn(sub.config, sub.inv_freq.device)
                sub.original_inv_freq = sub.inv_freq
    load_seconds = time.perf_counter() - started

    frames = int(job["frames"])
    # The reference runs a frame's code predictor in the *next* talker step:
    # one more step gives ``frames`` whole frames.
    _force_frames(model, frames + 1)
    results = []
    for index, request in enumerate([job["warmup"], *job["requests"]]):
        begin = time.perf_counter()
        with torch.inference_mode():
            codes_list, _ = model.generate(
                input_ids=[torch.tensor([request["text_ids"]])],
                languages=[request["language"]],
                speakers=[request["speaker"]],
                non_streaming_mode=True,
                max_new_tokens=(request.get("frames") or frames) + 1,
                do_sample=True,
                subtalker_dosample=True,
            )
            generated = time.perf_counter()
            codes = codes_list[0]
            wav = codec.decode(codes[None]).audio_values[0]
        done = time.perf_counter()
        if index:  # the first is the warm-up
            results.append(
                {
                    "frames": int(codes.shape[0]),
                    "samples": int(wav.shape[-1]),
                    "generate_s": generated - begin,
                    "total_s": done - begin,
                }
            )
    print(json.dumps({"tensors": tensors, "load_s": load_seconds, "requests": results}))


if __name__ == "__main__":
    main()
