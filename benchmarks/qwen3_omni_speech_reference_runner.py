"""The reference's side of ``bench_qwen3_omni_speech.py``: run inside the reference environment.

Usage: ``python qwen3_omni_speech_reference_runner.py JOB.json OUT.json`` with
the reference environment's python (transformers 4.57.3; see
``plugins/qwen3_tts/tests/REFERENCE.md``). It never imports omni.

1. Builds transformers' ``Qwen3OmniMoeForConditionalGeneration`` from the
   job's root config (sdpa, float32, parameter init switched off), fills
   every parameter with the thinker benchmark's ``fill_parameter`` (seeded by
   the parameter's name) and code2wav's again with the damped values of
   ``code2wav_reference.py`` (so the waveform stays out of the clamp), zeroes
   the rows of the thinker's LM head for its end ids and the talker's
   ``codec_head`` row for the codec EOS (a zero logit among 152064 / 2049
   random ones is never greedy and never inside a top-k: every answer runs to
   its limits on both sides, so both make the same number of tokens and
   frames), and writes the checkpoint directory once: ``save_pretrained``
   (safetensors) plus the tiny preset's tokenizer, chat template and
   preprocessor files (``plugins/qwen3_omni/tools/make_tiny_preset.py``),
   which keep the release's special ids.
2. Times the library's own ``generate(..., return_audio=True, speaker=...)``
   on the job's chat prompts, one request at a time (with audio output it
   refuses batches): a warm-up call, then each request from the call to the
   returned waveform (non-streaming: the first audio is all of it), with the
   time inside the thinker's ``generate``, the talker's ``generate`` and
   code2wav, the frames and samples made.

Sampling: ``release`` (the default): the thinker as generation_config.json
says (top-k 20, top-p 0.8, temperature 0.7, repetition penalty 1.05; passed
explicitly, since this ``generate`` runs the thinker with its own generation
config, built from ``thinker_config``, not that file), the talker and code
predictor as ``generate`` does by default (top-k 50, temperature 0.9,
repetition penalty 1.05; top-k 50, top-p 0.8), each request seeded. ``greedy``: greedy
everywhere, the code predictor forced greedy (the release samples it
whatever ``talker_do_sample`` says), no thinker repetition penalty; the
waveforms are then written to ``OUT.npz`` (``generate`` decodes at most 300
frames in one chunk, i.e. the unchunked forward here) for comparison.
"""

from __future__ import annotations

import importlib.util
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
THINKER_RUNNER = HERE / "qwen3_omni_thinker_reference_runner.py"
TOOL = HERE.parent / "plugins" / "qwen3_omni" / "tools" / "make_tiny_preset.py"
CODE2WAV_FILL = (
    HERE.parent / "plugins" / "qwen3_omni" / "tests" / "reference" / "code2wav_reference.py"
)
THINKER_EOS = (151643, 151645)


def load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(job: dict[str, Any]) -> tuple[Any, float]:
    from transformers.modeling_utils import no_init_weights
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeForConditionalGeneration,
    )

    fill = load(THINKER_RUNNER, "thinker_runner").fill_parameter
    config = Qwen3OmniMoeConfig(**job["config"])
    started = time.perf_counter()
    with no_init_weights():
        model = Qwen3OmniMoeForConditionalGeneration(config)
    model.set_attn_implementation("sdpa")
    model = model.eval().requires_grad_(False)
    for name, param in model.named_parameters():
        fill(name, param.data, int(job["seed"]))
    # fill_parameter's values drive the SnakeBeta decoder far into the clamp.
    load(CODE2WAV_FILL, "code2wav_reference").randomise(model.code2wav, int(job["seed"]))
    with torch.no_grad():
        model.thinker.lm_head.weight[list(THINKER_EOS)] = 0.0
        model.talker.codec_head.weight[config.talker_config.codec_eos_token_id] = 0.0
    return model, time.perf_counter() - started


def write_checkpoint(model: Any, ckpt: Path) -> float:
    started = time.perf_counter()
    tool = load(TOOL, "make_tiny_preset")
    model.save_pretrained(ckpt, safe_serialization=True)
    tool.write_tokenizer_files(ckpt)
    (ckpt / "preprocessor_config.json").write_text(json.dumps(tool.preprocessor_config(), indent=1))
    (ckpt / "generation_config.json").write_text(json.dumps(tool.generation_config(), indent=1))
    return time.perf_counter() - started


class Phases:
    """Seconds inside the thinker's generate, the talker's generate and code2wav, per call."""

    def __init__(self, model: Any, greedy: bool):
        self.seconds: dict[str, float] = {}
        self.codes: Any = None
        for label, owner, attr in (
            ("thinker", model.thinker, "generate"),
            ("talker", model.talker, "generate"),
            ("code2wav", model.code2wav, "chunked_decode"),
        ):
            setattr(owner, attr, self._timed(label, getattr(owner, attr)))
        if greedy:  # the release samples its code predictor whatever talker_do_sample says
            predictor = model.talker.code_predictor
            original = predictor.generate

            def greedy_predictor(*args: Any, **kwargs: Any) -> Any:
                kwargs.update(do_sample=False, top_k=None, top_p=None)
                return original(*args, **kwargs)

            predictor.generate = greedy_predictor

    def _timed(self, label: str, method: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            if label == "code2wav":
                self.codes = args[0]
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[label] = time.perf_counter() - started

        return run


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out_path = Path(sys.argv[2])
    torch.set_num_threads(int(job["threads"]))
    from transformers.utils import import_utils

    # Nothing here needs torchvision (text prompts); a CUDA build of it fails
    # to import on a CPU host, so tell transformers it is absent.
    import_utils._torchvision_available = False
    from transformers import AutoTokenizer

    model, build_s = build(job)
    ckpt = Path(job["checkpoint"])
    write_s = write_checkpoint(model, ckpt)
    # Written in float32 whatever the dtype, as the other side reads it; then the
    # whole model cast, as from_pretrained(dtype=...) loads the release.
    model = model.to(getattr(torch, job.get("dtype", "float32")))
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    greedy = job["sampling"] == "greedy"
    phases = Phases(model, greedy)

    def generate(messages: list[dict], speaker: str, tokens: int, frames: int, seed: int) -> Any:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        input_ids = torch.tensor([ids], dtype=torch.long)
        if greedy:
            settings = {"thinker_do_sample": False, "talker_do_sample": False}
        else:
            settings = {
                "thinker_do_sample": True,
                "thinker_temperature": 0.7,
                "thinker_top_k": 20,
                "thinker_top_p": 0.8,
                "thinker_repetition_penalty": 1.05,
                "talker_do_sample": True,  # and the release's talker_* defaults
            }
        torch.manual_seed(seed)
        model.thinker.rope_deltas = None
        model.talker.rope_deltas = None
        started = time.perf_counter()
        with torch.inference_mode():
            result, wav = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                speaker=speaker,
                return_audio=True,
                thinker_max_new_tokens=tokens,
                talker_max_new_tokens=frames + 1,  # frames = talker tokens - 1
                **settings,
            )
        total = time.perf_counter() - started
        generated = result.sequences[0, len(ids) :].tolist()
        return {
            "prompt_tokens": len(ids),
            "tokens": generated,
            "frames": int(phases.codes.shape[-1]),
            "samples": int(wav.numel()),
            "total_s": total,
            "phases": dict(phases.seconds),
        }, wav.reshape(-1).float().numpy()

    warm = job["requests"][0]
    generate(warm["messages"], warm["speaker"], 2, 3, 0)
    runs, wavs = [], {}
    for i, request in enumerate(job["requests"][: int(job["reference_requests"])]):
        run, wav = generate(
            request["messages"], request["speaker"], job["tokens"], job["frames"], request["seed"]
        )
        runs.append(run)
        wavs[f"request_{i}"] = wav
    result = {
        "threads": torch.get_num_threads(),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "build_s": build_s,
        "write_s": write_s,
        "parameters": sum(p.numel() for p in model.parameters()),
        "parts": {
            part: sum(p.numel() for p in getattr(model, part).parameters())
            for part in ("thinker", "talker", "code2wav")
        },
        "runs": runs,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if greedy:
        import numpy as np

        np.savez(out_path.with_suffix(".npz"), **wavs)
    out_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
