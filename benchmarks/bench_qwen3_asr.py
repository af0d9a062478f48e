"""Qwen3-ASR transcription speed on this machine: omni's stages vs qwen-asr's transformers backend.

Run: ``python benchmarks/bench_qwen3_asr.py [--layers 4] [--encoder-layers 4] [--threads 2]``
(a few minutes on two CPU cores). Without the reference environment
(``--reference-python``, default ``/tmp/qwen-asr-ref/bin/python``, built by
``make qwen-asr-reference-env``) only ours runs, on seeded dummy weights, and
the reference's figures read ``skipped``.

What runs: Qwen3-ASR-0.6B's widths (audio tower d_model 896, 14 heads, MLP
3584; decoder hidden 1024, 16 / 8 heads of 128, MLP 3072, vocabulary 151936)
with ``--encoder-layers`` tower layers and ``--layers`` decoder layers (the
release has 18 and 28), float32 on the CPU, ``--threads`` torch threads on
both sides. The clips are espeak-ng sentences (a chord where espeak-ng is
missing), 16 kHz; every transcript is greedy and ``--new-tokens`` long at most.

* the reference first, in its own environment (``qwen3_asr_reference_runner.py``):
  it builds the model, fills it with seeded values and saves it with the
  release's ``save_pretrained``; then ``Qwen3ASRModel.transcribe`` on every
  clip one at a time (concurrency 1) and all clips in one batch (concurrency
  ``--concurrency``);
* then ours, loading that same checkpoint: the preprocessing stage (decode,
  log-mel, prompt), the asr stage (tower, then the decoder on the torch engine)
  and the decode stage, in this process: the clips one at a time, then all at
  once (the engine batches their decoding).

Figures: audio seconds transcribed per wall second at concurrency 1 and at
``--concurrency``, and, for ours, the time to the first text of one streamed
transcription (from the WAV bytes to the first text delta; the release's
transformers backend does not stream). The machine may be shared: figures
vary from run to run; compare the two sides of one run.

``--smoke``: the tiny preset's config, two short clips, ours alone, in seconds.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import soundfile as sf
import soxr
import torch

from omni_core.sigterm import run_script

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "qwen3_asr_reference_runner.py"
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "please transcribe this sentence as quickly as you can",
    "speech recognition turns sound into written words",
    "a small model runs on two cores of a laptop",
    "every stage of the pipeline runs in one process",
    "the decoder writes one token at a time",
    "batches of requests share each decoding step",
    "the audio tower hears thirteen frames a second",
]


def clips(count: int, smoke: bool) -> list[np.ndarray]:
    """``count`` spoken sentences at 16 kHz (a chord when espeak-ng is missing)."""
    out = []
    for i in range(count):
        if shutil.which("espeak-ng") is None:
            t = np.arange(16_000 * (1 if smoke else 3)) / 16_000
            out.append((0.3 * np.sin(2 * np.pi * (220 + 40 * i) * t)).astype(np.float32))
            continue
        with tempfile.NamedTemporaryFile(suffix=".wav") as wav:
            subprocess.run(["espeak-ng", "-w", wav.name, SENTENCES[i % len(SENTENCES)]], check=True)
            samples, rate = sf.read(wav.name, dtype="float32")
        out.append(soxr.resample(samples, rate, 16_000).astype(np.float32))
    return out


def config(layers: int, encoder_layers: int, smoke: bool) -> dict[str, Any]:
    from omni_qwen3_asr.source import PRESETS_DIR

    raw = json.loads((PRESETS_DIR / "tiny" / "config.json").read_text())
    for key in ("architectures", "model_type"):
        raw.pop(key)
    raw["thinker_config"].pop("model_type")
    if smoke:
        return raw
    raw["thinker_config"]["audio_config"].update(
        d_model=896, encoder_layers=encoder_layers, encoder_attention_heads=14,
        encoder_ffn_dim=3584, output_dim=1024, n_window_infer=800, downsample_hidden_size=480,
    )  # fmt: skip
    raw["thinker_config"]["text_config"].update(
        hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072,
        rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True},
    )  # fmt: skip
    return raw


def run_reference(args: Any, raw: dict, audio: list[np.ndarray], out: Path) -> dict | None:
    python = Path(args.reference_python)
    if args.smoke or not python.exists():
        return None
    from omni_qwen3_asr.source import PRESETS_DIR

    request = {
        "config": raw, "preset": str(PRESETS_DIR / "tiny"), "seed": 3, "threads": args.threads,
        "new_tokens": args.new_tokens, "batch": args.concurrency,
    }  # fmt: skip
    (out / "request.json").write_text(json.dumps(request))
    np.savez(out / "clips.npz", **{f"{i:03d}": c for i, c in enumerate(audio)})
    done = subprocess.run(
        [str(python), str(RUNNER), str(out)], capture_output=True, text=True, env={**os.environ}
    )
    if done.returncode:
        raise RuntimeError(f"the reference runner failed:\n{done.stderr[-4000:]}")
    return json.loads((out / "timings.json").read_text())


class _Request:
    def __init__(self, data: Any, request_id: str, stream: Any = None):
        self.data, self.request_id, self._stream, self.emitted = data, request_id, stream, []
        self.first: float | None = None

    @property
    async def stream(self):
        async for item in self._stream:
            yield item

    async def emit(self, item: Any) -> None:
        if isinstance(item, str) and self.first is None:
            self.first = time.perf_counter()
        self.emitted.append(item)


def _wav(clip: np.ndarray) -> str:
    buffer = io.BytesIO()
    sf.write(buffer, clip, 16_000, format="WAV", subtype="FLOAT")
    return base64.b64encode(buffer.getvalue()).decode()


async def transcribe(stages: tuple, wav: str, rid: str, new_tokens: int) -> float | None:
    """One request through preprocessing, asr and decode; when its first text came."""
    pre, asr, decode = stages
    part = {"type": "input_audio", "input_audio": {"data": wav}}
    data = {
        "messages": [{"role": "user", "content": [part]}],
        "sampling": {"max_tokens": new_tokens, "temperature": 0.0},
        "transcription": {"task": "transcribe"},
    }  # fmt: skip
    prepared = await pre.run(_Request(data, rid))
    send, receive = anyio.create_memory_object_stream[Any](1000)
    asr_request = _Request(prepared, rid)

    async def forward(item: Any) -> None:
        await send.send(item)

    asr_request.emit = forward  # type: ignore[method-assign]
    text = _Request(None, rid, receive)
    async with anyio.create_task_group() as tg:

        async def run_asr() -> None:
            async with send:
                await asr.run(asr_request)

        tg.start_soon(run_asr)
        await decode.run(text)
    return text.first


def dummy_checkpoint(raw: dict, directory: Path) -> str:
    """A directory with ``raw`` as its config and the tiny preset's tokenizer (no weights)."""
    from omni_qwen3_asr.source import PRESETS_DIR

    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(raw))
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "chat_template.json"):
        shutil.copy(PRESETS_DIR / "tiny" / name, directory / name)
    return str(directory)


def run_ours(args: Any, model_path: str, load: str, audio: list[np.ndarray]) -> dict[str, float]:
    from omni_core.engine.compute import dedicate
    from omni_qwen3_asr.stages import create_asr, create_decode, create_preprocessing

    torch.set_num_threads(args.threads)
    stages = (
        create_preprocessing(model_path, max_tokens=args.new_tokens),
        create_asr(model_path, load_format=load, dtype="float32"),
        create_decode(model_path),
    )
    wavs = [_wav(c) for c in audio]
    dedicate(args.threads)  # what a stage process does once built (engine/compute.py)

    async def measure() -> dict[str, float]:
        await transcribe(stages, wavs[0], "warm", args.new_tokens)
        started = time.perf_counter()
        for i, wav in enumerate(wavs):
            await transcribe(stages, wav, f"one{i}", args.new_tokens)
        one = time.perf_counter() - started
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i, wav in enumerate(wavs):
                tg.start_soon(transcribe, stages, wav, f"all{i}", args.new_tokens)
        together = time.perf_counter() - started
        started = time.perf_counter()
        first = await transcribe(stages, wavs[0], "ttft", args.new_tokens)
        await stages[1].aclose()
        return {"one": one, "batch": together, "first": (first or started) - started}

    return anyio.run(measure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--encoder-layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--reference-python", default="/tmp/qwen-asr-ref/bin/python")
    parser.add_argument("--smoke", action="store_true", help="tiny config, ours only, seconds")
    args = parser.parse_args()
    if args.smoke:
        args.concurrency, args.new_tokens = 2, 4
    audio = clips(args.concurrency, args.smoke)
    seconds = sum(len(c) for c in audio) / 16_000
    raw = config(args.layers, args.encoder_layers, args.smoke)
    with tempfile.TemporaryDirectory() as tmp:
        reference = run_reference(args, raw, audio, Path(tmp))
        if reference is not None:  # the reference's saved weights, on both sides
            ours = run_ours(args, str(Path(tmp) / "ckpt"), "safetensors", audio)
        else:
            if not args.smoke:
                print("reference: skipped (no reference environment; ours on dummy weights)")
            ours = run_ours(args, dummy_checkpoint(raw, Path(tmp) / "dummy"), "dummy", audio)
    print(f"clips: {len(audio)}, {seconds:.1f} s of audio; {args.new_tokens} tokens at most each")
    for label, name in (("one", "concurrency 1"), ("batch", f"concurrency {args.concurrency}")):
        mine = seconds / ours[label]
        theirs = f"{seconds / reference[label]:.2f}" if reference else "skipped"
        print(f"{name}: ours {mine:.2f} audio s / wall s, reference {theirs}")
    print(f"time to first text (streamed, ours): {ours['first']:.3f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    run_script(main)
