"""The reference's side of ``bench_moss_tts.py``: run inside the MOSS-TTS reference environment.

Usage: ``python moss_tts_reference_runner.py JOB.json`` with the reference
environment's python (transformers 5.0.0 and OpenMOSS's sources at pinned
commits, see ``plugins/moss_tts/tests/REFERENCE.md``). It never imports omni.

It loads the checkpoint that ``bench_moss_tts.py`` wrote (our weights in the
release's layout) the release's way -- ``AutoProcessor.from_pretrained``
(tokenizer, and the codec named by ``processor_config.json``) and
``AutoModel.from_pretrained`` (``MossTTSDelayModel``), both as remote code
from the checkpoint, float32 -- and checks that every tensor of both models
equals the file's (nothing missing, nothing left over, nothing re-initialised).
With the job's ``dtype`` ``bfloat16`` the model's parameters are then cast to
bfloat16 (the codec stays float32).

Then for each concurrency N of the job it does what the release offers for N
requests: one ``generate`` over N conversations (its processor left-pads
them: static batching), then ``processor.decode`` of the outputs (the codec;
one request after another, as it loops). Text is greedy
(``text_temperature=0``), audio sampled with the job's parameters (the
release's defaults). ``max_new_tokens = frames + 32``: with the benchmark's
weights the text head opens audio at step 0 and keeps choosing the gen slot,
and N steps in audio hold N - 32 complete frames. Frames are counted from
the decoded audio (1920 samples each).

Timings per level: the processor, ``generate`` (with the backbone's share
and the prefill, timed by wrapping ``language_model.forward``), and the
codec decode. One JSON line on stdout carries everything.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SAMPLES_PER_FRAME = 1920
GEN_SLOT = 151656


def check_equal(module: Any, files: list[Path], what: str) -> int:
    """Every tensor of ``files`` equals the module's, and the module has no other."""
    import torch
    from safetensors import safe_open

    state = module.state_dict()
    seen = set()
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name not in state:
                    raise AssertionError(f"{what}: {name} of {file} is not in the model")
                if not torch.equal(state[name], handle.get_tensor(name)):
                    raise AssertionError(f"{what}: {name} differs from {file}")
                seen.add(name)
    missing = sorted(set(state) - seen)
    if missing:
        raise AssertionError(f"{what}: not in the checkpoint: {missing[:8]}")
    return len(seen)


def materialize(module: Any) -> None:
    """Copy weights that still map the checkpoint file into the process's own memory.

    transformers 5 keeps float32 tensors of a float32 checkpoint as views of
    the memory-mapped file, i.e. page cache that a busy machine may evict
    mid-run (ours copies into its own memory). The release ships bfloat16,
    which a float32 run converts into its own memory anyway: this gives the
    reference the same footing here.
    """
    import torch

    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.data = tensor.data.clone()


def memory_gb() -> dict[str, float]:
    """This process's resident memory: anonymous, and file-backed (the mapped checkpoint)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "VmHWM"):
            fields[key] = round(int(value.split()[0]) / 2**20, 2)
    return fields


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    os.environ["HF_MODULES_CACHE"] = job["modules_cache"]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")

    import torch
    import transformers
    from transformers import AutoModel, AutoProcessor

    if transformers.__version__ != "5.0.0":
        raise SystemExit(f"transformers {transformers.__version__}: the reference pins 5.0.0")
    torch.set_num_threads(int(job["threads"]))
    model_dir = Path(job["model_dir"])
    attn = job["attn_implementation"]

    started = time.perf_counter()
    # The processor first, as the release's README does (its module imports the
    # normaliser that the model's module needs; see tests/reference/make_reference.py).
    processor = AutoProcessor.from_pretrained(str(model_dir), trust_remote_code=True)
    model, info = AutoModel.from_pretrained(
        str(model_dir),
        trust_remote_code=True,
        attn_implementation=attn,
        dtype=torch.float32,
        output_loading_info=True,
    )
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise AssertionError(f"loading the model reported {problems}")
    codec = processor.audio_tokenizer.eval()
    codec_dir = Path(
        json.loads((model_dir / "processor_config.json").read_text())[
            "audio_tokenizer_name_or_path"
        ]
    )
    tensors = check_equal(model, [model_dir / "model.safetensors"], "model")
    tensors += check_equal(codec, [codec_dir / "model.safetensors"], "codec")
    for module in (model, codec):
        materialize(module)
    dtypes = {p.dtype for p in model.parameters()} | {p.dtype for p in codec.parameters()}
    if dtypes != {torch.float32}:
        raise AssertionError(f"expected float32 weights, got {dtypes}")
    if job.get("dtype", "float32") == "bfloat16":
        # After the equality check (the files are float32). Parameters only: buffers such
        # as the rotary tables stay float32, as from_pretrained in bfloat16 leaves them;
        # the codec stays float32.
        for param in model.parameters():
            param.data = param.data.to(torch.bfloat16)
    load_s = time.perf_counter() - started
    loaded_memory = memory_gb()

    texts = job["texts"]
    prompt_text_ids = [
        processor([[processor.build_user_message(text=t)]], mode="generation")["input_ids"][
            0, :, 0
        ].tolist()
        for t in texts
    ]

    audio = job["audio"]
    backbone = model.language_model
    inner = backbone.forward
    calls: list[tuple[float, int]] = []

    def timed_forward(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        out = inner(*args, **kwargs)
        embeds = kwargs.get("inputs_embeds")
        calls.append(
            (time.perf_counter() - begin, int(embeds.shape[1]) if embeds is not None else 0)
        )
        return out

    backbone.forward = timed_forward

    def run(count: int, max_new_tokens: int, decode: bool = True) -> dict[str, Any]:
        conversations = [
            [processor.build_user_message(text=texts[i % len(texts)])] for i in range(count)
        ]
        calls.clear()
        begin = time.perf_counter()
        batch = processor(conversations, mode="generation")
        prepared = time.perf_counter()
        outputs = model.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            max_new_tokens=max_new_tokens,
            text_temperature=0,
            audio_temperature=audio["temperature"],
            audio_top_p=audio["top_p"],
            audio_top_k=audio["top_k"],
        )
        generated = time.perf_counter()
        messages = processor.decode(outputs) if decode else [None] * count
        done = time.perf_counter()
        samples = []
        gen_slots = []
        for message, (_, ids) in zip(messages, outputs, strict=True):
            wavs = [] if message is None else message.audio_codes_list
            samples.append(sum(int(w.shape[-1]) for w in wavs))
            gen_slots.append(int((ids[:, 0] == GEN_SLOT).sum()))
        prefill = [t for t, n in calls if n > 1]
        return {
            "concurrency": count,
            "wall_s": done - begin,
            "processor_s": prepared - begin,
            "generate_s": generated - prepared,
            "decode_s": done - generated,
            "steps": len(calls),
            "backbone_s": sum(t for t, _ in calls),
            "prefill_s": sum(prefill),
            "prompt_positions": int(batch["input_ids"].shape[1]),
            "samples": samples,
            "frames": [s // SAMPLES_PER_FRAME for s in samples],
            "audio_s": sum(samples) / 24000,
            "gen_slots": gen_slots,
        }

    torch.manual_seed(int(job["seed"]))
    run(1, 4, decode=False)  # warm-up: prefill and a few steps, no audio yet
    with torch.inference_mode():  # and the codec
        codes = torch.randint(0, 1024, (4, 32), generator=torch.Generator().manual_seed(0))
        processor.decode_audio_codes([codes])
    levels = []
    for count in job["levels"]:
        runs = []
        for _ in range(int(job.get("repeats", 1))):
            torch.manual_seed(int(job["seed"]) + count)
            runs.append(run(int(count), int(job["max_new_tokens"])))
        levels.append(min(runs, key=lambda r: r["wall_s"]))
    print(
        json.dumps(
            {
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "attn_implementation": model.config._attn_implementation,
                "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                "tensors": tensors,
                "load_s": load_s,
                "memory_gb": {"loaded": loaded_memory, "end": memory_gb()},
                "prompt_text_ids": prompt_text_ids,
                "levels": levels,
            }
        )
    )


if __name__ == "__main__":
    main()
