"""MOSS-TTS at real width (dummy weights) on this machine: ours vs the official implementation.

Run: ``python benchmarks/bench_moss_tts.py [--layers 2] [--frames 50] [--threads 2]``
(about 9 minutes on two shared CPU cores with the defaults, 14.7 GB of
checkpoint written to a temporary directory first; ``--quick``: concurrency
1 and 4, 25 frames, one run each, about 2.5 minutes; ``--workdir DIR``
keeps the checkpoint for the next run). Needs the reference environment
(``make moss-reference-env``, default ``/tmp/moss-tts-ref``;
``--no-reference`` measures ours alone). ``--smoke``: the tiny preset with
dummy weights (no checkpoint written), a few frames at concurrency 1 and 2,
ours alone, in seconds: it checks that the script still runs (``make test``).
``--dtype bfloat16`` runs our backbone in bf16, ``--quantization int8``
adds int8 weight-only backbone layers (``w8a8_int8``: int8 activations
too, on oneDNN's integer kernel) and ``--fp16-row-weights`` float16
copies of its blocked weights for one- and two-row products (the tts_engine
stage's ``factory.dtype``, ``factory.quantization`` and
``factory.fp16_row_weights``; the checkpoint stays float32);
``--reference-dtype bfloat16`` casts the reference's model after its strict
load (its codec stays float32). ``--codec-dtype bfloat16`` is our vocoder
stage's ``factory.dtype = "bfloat16"`` (the codec decoder's transformers in
bf16; the default float32 is ``auto``, the release's). ``--compile`` compiles our backbone's decode
step (``engine.enable_torch_compile``), ``--cpu-weight-prepack`` with it
packs its weights for inductor's GEMM template (``engine.cpu_weight_prepack``).
``benchmarks/gpu_check.py`` runs ``ours`` on a GPU in bf16.

Our decode step at concurrency 1 is also set against the memory-bandwidth
limit (``roofline.py``): the weights one step in the middle of a request
reads, counted op by op in the dtype used, plus its KV cache, over the limit
measured at the start and the end of the run (the higher kept), as a
percentage of the step's measured time (backbone + heads and sampling), and
of the sustained rate (the median pass) beside it; and the counted step's
weight-reading ops run again alone (``roofline.kernel_seconds``): their time
against the limit, and the rest of the step.

What is measured, and why this shape. The issue's target is speed at the
real architecture, so the script writes a checkpoint in the release's
layout at MOSS-TTS 8B's width -- Qwen3 backbone with hidden 4096, 32 heads /
8 KV heads of 128, intermediate 12288, vocabulary 151936, 32 codebooks of
1024 (+ pad) as 32 embeddings and 32 heads beside the text head -- with
``--layers`` decoder layers (the release has 36; two keep a float32 copy
near 8 GB so that it fits this machine), and the real codec
(MOSS-Audio-Tokenizer, the release's ``config.json``, 1.6 B parameters,
float32). Weights are our ``dummy`` loader's (seeded; the text head steered
so the model opens audio at once and, with greedy text, speaks until the
frame cap), saved in the release's layout: ``model/`` (``config.json`` with
``language_config`` and ``auto_map``, ``model.safetensors``, the tokenizer
files of our ``tiny`` preset, ``processor_config.json`` naming the codec,
the release's remote-code files) and ``codec/`` (``config.json``,
``model.safetensors``, its remote-code files). Both sides load these same
files strictly and compute in float32 with ``--threads`` torch threads, one
side at a time (ours, then it is freed, then the reference's subprocess).

* ours: the stages' own factories (``create_preprocessing``,
  ``create_tts_engine``: strict load, the backbone's linear weights packed
  for oneDNN, ``TTSEngine`` over ``TorchEngine``; ``create_vocoder``: the
  shared streaming ``Vocoder``, first chunk 2 frames, growing fourfold up to 48,
  stateful decode, concurrent requests' equal chunks decoded as one batch
  up to the stage's ``max_batch_size``), driven directly without the
  runtime's processes. At
  concurrency N, N requests are submitted at once; frames stream from the
  engine to the vocoder while they are generated (continuous batching).
* the reference: the official ``MossTTSDelayModel.generate`` and
  ``MossTTSDelayProcessor`` (remote code from the checkpoint, transformers
  5.0.0), run by ``moss_tts_reference_runner.py`` in its own environment.
  Concurrency N is its own static batching: one ``generate`` over N
  conversations, left-padded by its processor, then ``processor.decode``
  (the codec), so its first audio is its whole audio.

Every request makes the same number of frames on both sides, ``--frames``
(default 50: a 4 s utterance): ours with ``max_frames`` (the engine closes
the segment at the cap: the 31-step drain, then ``audio_end``), the
reference with ``max_new_tokens = frames + 32`` (``audio_start`` at step 0,
then gen slots, which greedy text keeps choosing with these weights; N steps
in audio hold N - 32 complete frames), so both run about ``frames + 33``
backbone steps per request. Text is greedy on both sides; audio is sampled
with the release's defaults (temperature 1.7, top-p 0.8, top-k 25), each of
our requests with its own seed. Frames are counted from the audio each side
returns and audio seconds follow from them.

Figures: audio seconds per wall second (all requests' audio / time from the
first submit to the last audio) at each concurrency, time to first audio
(ours: submit to the first chunk out of the vocoder; the reference: its
whole time to audio), the ratios ours / reference, and where time goes
(ours at concurrency 1: prefill, backbone step, heads + sampling, codec
decode per frame; the reference's: backbone vs the whole forward and
sampling, codec decode per frame). The sides alternate for ``--rounds``
rounds (default 2: ours, the reference, ours, the reference) and each level
keeps its fastest run per side: the machine is shared, and a slow spell
would otherwise decide a ratio. One JSON line
(``BENCH_JSON``) repeats the figures.

Reading them: with 2 of 36 layers the parts whose cost does not grow with
depth -- the 151936-row text head (2.5 GB of float32 read every step by the
reference, two rows by us inside audio), the 32 audio heads, sampling and
the codec -- weigh far more than in the real model, where 36 layers (about
28 GB of float32) dominate every step on both sides. So below the release's depth
the script also prints each level projected to 36 layers: each side's measured
backbone time (prefill and steps) scaled by 36 / ``--layers``, the rest as
measured (``projected_wall``); the targets are judged on the measured figures.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import roofline  # its kernel_seconds and kernels_line: a step's kernels alone
import torch
from codec_watch import CodecWatch
from roofline import Bandwidth, StepReads, best, kv_bytes, limit_line, read_bandwidth

from omni_core.engine.compute import dedicate, run_compute
from omni_core.engine.huge_pages import ask_for_huge_pages, user_environ
from omni_core.engine.quantize import QUANTIZATIONS, quantization_problem
from omni_core.sigterm import run_script
from omni_moss_tts import stages
from omni_moss_tts.model import MossTTSModel
from omni_moss_tts.source import PRESETS_DIR

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "moss_tts_reference_runner.py"
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
FRAME_RATE = SAMPLE_RATE / SAMPLES_PER_FRAME  # 12.5 frames per second
RELEASE_LAYERS = 36  # MOSS-TTS 8B's backbone
DEFAULT_REF_PYTHON = Path(os.environ.get("MOSS_TTS_REF_PYTHON", "/tmp/moss-tts-ref/bin/python"))
DEFAULT_REF_SRC = Path(os.environ.get("MOSS_TTS_REF_SRC", "/tmp/moss-tts-ref/src"))
CODEC_MIRROR = Path("/work/.mirror/OpenMOSS+MOSS-Audio-Tokenizer/repo")
MODEL_FILES = (
    "configuration_moss_tts.py",
    "modeling_moss_tts.py",
    "processing_moss_tts.py",
    "inference_utils.py",
    "tts_robust_normalizer_single_script.py",
)
CODEC_FILES = ("configuration_moss_audio_tokenizer.py", "modeling_moss_audio_tokenizer.py")
TEXTS = [
    "Hello, this is a benchmark of the speech pipeline.",
    "The user is an assistant, and the assistant is the user.",
    "One two three four five six seven eight nine ten.",
    "There are more things in heaven and earth than are dreamt of.",
    "A quick brown fox jumps over the lazy dog by the river.",
    "Please speak clearly, slowly, and with a friendly voice.",
    "Streaming audio should start long before the sentence ends.",
    "Every request here makes exactly the same number of frames.",
]


# -- the checkpoint, in the release's layout ------------------------------------------


def language_config(layers: int) -> dict[str, Any]:
    """MOSS-TTS 8B's backbone (Qwen3-8B shapes) with ``layers`` decoder layers."""
    return {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
    }


def model_config(layers: int) -> dict[str, Any]:
    """The root ``config.json`` (``moss_tts_delay``), ids the release's defaults."""
    return {
        "architectures": ["MossTTSDelayModel"],
        "auto_map": {
            "AutoConfig": "configuration_moss_tts.MossTTSDelayConfig",
            "AutoModel": "modeling_moss_tts.MossTTSDelayModel",
        },
        "model_type": "moss_tts_delay",
        "language_config": language_config(layers),
        "n_vq": 32,
        "audio_vocab_size": 1024,
        "audio_pad_code": 1024,
        "pad_token_id": 151643,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "audio_start_token_id": 151652,
        "audio_end_token_id": 151653,
        "audio_user_slot_token_id": 151654,
        "audio_assistant_gen_slot_token_id": 151656,
        "audio_assistant_delay_slot_token_id": 151662,
        "sampling_rate": 24000,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def codec_config(reference_src: Path) -> dict[str, Any]:
    """MOSS-Audio-Tokenizer's released ``config.json`` (pinned source, else the mirror)."""
    pinned = reference_src / "MOSS-Audio-Tokenizer" / "config.json"
    if pinned.is_file():
        return json.loads(pinned.read_text())
    shown = subprocess.run(
        ["git", "-C", str(CODEC_MIRROR), "show", "HEAD:config.json"],
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        raise FileNotFoundError(
            f"the codec's released config.json is neither at {pinned} nor in {CODEC_MIRROR}"
        )
    return json.loads(shown.stdout)


def write_configs(root: Path, layers: int, reference_src: Path) -> tuple[Path, Path]:
    """Configs, tokenizer and remote-code files of ``root/model`` and ``root/codec``."""
    model_dir, codec_dir = root / "model", root / "codec"
    model_dir.mkdir(parents=True, exist_ok=True)
    codec_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model_config(layers), indent=1))
    (codec_dir / "config.json").write_text(json.dumps(codec_config(reference_src), indent=1))
    tiny = PRESETS_DIR / "tiny"
    for name in ("vocab.json", "merges.txt", "chat_template.jinja"):
        shutil.copy(tiny / name, model_dir / name)
    # As the reference harness writes it (tests/reference/make_reference.py): the
    # template lives in chat_template.jinja, and transformers 5 reads no processor
    # class or extra special tokens from here.
    tokenizer = json.loads((tiny / "tokenizer_config.json").read_text())
    for key in ("chat_template", "processor_class", "extra_special_tokens"):
        tokenizer.pop(key, None)
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=1))
    processor = {
        "processor_class": "MossTTSDelayProcessor",
        "auto_map": {"AutoProcessor": "processing_moss_tts.MossTTSDelayProcessor"},
        "audio_tokenizer_name_or_path": str(codec_dir.resolve()),
    }
    (model_dir / "processor_config.json").write_text(json.dumps(processor, indent=1))
    # The release's remote code, loaded by the reference (trust_remote_code).
    for names, source, target in (
        (MODEL_FILES, reference_src / "MOSS-TTS" / "moss_tts_delay", model_dir),
        (CODEC_FILES, reference_src / "MOSS-Audio-Tokenizer", codec_dir),
    ):
        for name in names:
            if (source / name).is_file():
                shutil.copy(source / name, target / name)
    return model_dir, codec_dir


_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write a ``.safetensors`` file tensor by tensor, without a second copy in memory.

    (``safetensors.torch.save_file`` turns every tensor into ``bytes`` before
    writing: another 8 GB for the backbone, which this machine does not have.)
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for tensor in tensors.values():
            flat = tensor.detach().contiguous().reshape(-1)
            if flat.numel():
                out.write(memoryview(flat.view(torch.uint8).numpy()))


def write_checkpoint(root: Path, layers: int, seed: int, reference_src: Path) -> dict[str, Any]:
    """Build our dummy model at real width and save both state dicts in the release's layout.

    Runs in a child process (``--write-checkpoint``) so that none of its
    memory stays with the benchmark.
    """
    model_dir, codec_dir = write_configs(root, layers, reference_src)
    started = time.perf_counter()
    model = MossTTSModel.from_pretrained(str(model_dir), load_format="dummy", seed=seed)
    assert model.codec is not None
    built = time.perf_counter() - started
    info = {
        "backbone_params": sum(p.numel() for p in model.network.parameters()),
        "codec_params": sum(p.numel() for p in model.codec.parameters()),
        "build_s": built,
    }
    started = time.perf_counter()
    save_safetensors(model.network.state_dict(), model_dir / "model.safetensors")
    save_safetensors(model.codec.state_dict(), codec_dir / "model.safetensors")
    info["save_s"] = time.perf_counter() - started
    info["bytes"] = sum((d / "model.safetensors").stat().st_size for d in (model_dir, codec_dir))
    (root / "checkpoint.json").write_text(json.dumps({"layers": layers, "seed": seed, **info}))
    return info


def ensure_checkpoint(root: Path, layers: int, seed: int, reference_src: Path) -> dict[str, Any]:
    stamp = root / "checkpoint.json"
    if stamp.is_file():
        info = json.loads(stamp.read_text())
        if info.get("layers") == layers and info.get("seed") == seed:
            write_configs(root, layers, reference_src)  # cheap: keep the files current
            info["reused"] = True
            return info
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--write-checkpoint",
            str(root),
            "--layers",
            str(layers),
            "--seed",
            str(seed),
            "--reference-src",
            str(reference_src),
        ],
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError("writing the checkpoint failed (see above)")
    info = json.loads(stamp.read_text())
    info["reused"] = False
    return info


# -- ours: the stages' code -------------------------------------------------------------


@dataclass
class StageRequest:
    """What a stage's ``run`` reads: the request id, its data or stream, and ``emit``."""

    request_id: str
    data: Any = None
    stream: Any = None
    sink: Any = None
    chunk_times: list[float] = field(default_factory=list)
    samples: int = 0

    async def emit(self, item: Any) -> None:
        if self.sink is not None:  # tts_engine -> vocoder
            await self.sink.send(item)
        else:  # vocoder -> client
            self.chunk_times.append(time.perf_counter())
            self.samples += int(item.shape[0])


@dataclass
class Level:
    concurrency: int
    wall_s: float
    audio_s: float
    first_audio_s: list[float]
    frames: list[int]
    steps: int
    codec_chunks: int
    codec_batches: int
    #: prompt positions the engine's prefills computed / copied from a cached template
    prompt: dict[str, int] = field(default_factory=dict)
    parts: dict[str, Any] = field(default_factory=dict)
    #: at concurrency 1, the vocoder's calls' wall time per decoded frame (codec_watch.py:
    #: each ends with the audio on the host, so on a GPU it holds the codec's kernels)
    codec_s: float = 0.0

    @property
    def throughput(self) -> float:
        return self.audio_s / self.wall_s


class Timers:
    """Time spent in a few methods of the model and codec (instance attributes wrap them)."""

    def __init__(self) -> None:
        self.records: dict[str, list[tuple[float, float, int]]] = {}  # (start, seconds, size)

    def wrap(self, owner: Any, name: str, key: str, size: Any) -> None:
        method = getattr(owner, name)

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            out = method(*args, **kwargs)
            self.records.setdefault(key, []).append(
                (begin, time.perf_counter() - begin, size(*args, **kwargs))
            )
            return out

        setattr(owner, name, timed)

    def unwrap(self, owner: Any, name: str) -> None:
        owner.__dict__.pop(name, None)


async def speak(
    pre: Any, engine: stages.TTSEngine, vocoder: Any, tag: str, data: dict[str, Any]
) -> StageRequest:
    """One request through the three stages, frames streaming from the engine to the vocoder."""
    prepared = await pre.run(StageRequest(tag, data=data))
    send, receive = anyio.create_memory_object_stream[Any](math.inf)
    produce = StageRequest(tag, data=prepared, sink=send)
    consume = StageRequest(tag, stream=receive)

    async def generate() -> None:
        async with send:
            await engine.run(produce)

    async with anyio.create_task_group() as group:
        group.start_soon(generate)
        summary = await vocoder.run(consume)
    consume.data = summary
    return consume


def request_data(index: int, frames: int, seed: int) -> dict[str, Any]:
    """The speech request as the preprocessing stage receives it (text greedy, audio default)."""
    return {
        "input": TEXTS[index % len(TEXTS)],
        "max_frames": frames,
        "seed": seed + index,
        "text_temperature": 0.0,
    }


async def run_level(
    pre: Any, engine: stages.TTSEngine, vocoder: Any, concurrency: int, frames: int, seed: int
) -> Level:
    done: list[StageRequest] = []
    steps = engine.engine.steps
    prompt = dict(engine.engine.prompt_positions)
    chunks, batches = vocoder.batcher.chunks, vocoder.batcher.batches
    started = time.perf_counter()

    async def one(i: int) -> None:
        data = request_data(i, frames, seed + 100 * concurrency)
        done.append(await speak(pre, engine, vocoder, f"c{concurrency}-{i}", data))

    async with anyio.create_task_group() as group:
        for i in range(concurrency):
            group.start_soon(one, i)
    wall = time.perf_counter() - started
    silent = [r.request_id for r in done if not r.chunk_times]
    if silent:  # a figure over requests that said nothing would flatter us: refuse it
        raise RuntimeError(
            f"{len(silent)} of {concurrency} requests made no audio ({', '.join(silent)}): "
            "the model ended its segment before its first frame"
        )
    return Level(
        concurrency=concurrency,
        wall_s=wall,
        audio_s=sum(r.samples for r in done) / SAMPLE_RATE,
        first_audio_s=[r.chunk_times[0] - started for r in done],
        frames=[int(r.data["frames"]) for r in done],
        steps=engine.engine.steps - steps,
        codec_chunks=vocoder.batcher.chunks - chunks,
        codec_batches=vocoder.batcher.batches - batches,
        prompt={k: n - prompt[k] for k, n in engine.engine.prompt_positions.items()},
    )


async def warm_up(pre: Any, engine: stages.TTSEngine, vocoder: Any, model: MossTTSModel) -> None:
    """A few engine steps (prefill and decode) and a short codec decode, outside the figures."""
    # a text no measured request says: the engine keeps the instruction template the
    # requests share (engine.disable_radix_cache), as a serving engine would, but
    # each measured prompt's own text is computed, as the reference computes it
    data = {**request_data(0, 4, 0), "input": "Warming up before the figures."}
    prepared = await pre.run(StageRequest("warm", data=data))
    prepared["sampling"].max_new_tokens = 4  # stops before any frame: no drain to wait for
    send, receive = anyio.create_memory_object_stream[Any](math.inf)
    async with send, receive:
        await engine.run(StageRequest("warm", data=prepared, sink=send))
    codec = vocoder.decoder
    codes = torch.randint(
        0, 1024, (1, model.config.n_vq, 4), generator=torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        codec.stream_rows(codes, codec.new_stream())


def breakdown(timers: Timers, level: Level) -> dict[str, Any]:
    """Where ours spends the time of a level.

    The engine and the vocoder run in threads of one process and share the
    cores, so a step that overlaps a codec call is slower than it would be
    alone: ``backbone_step_alone_ms`` averages the steps that overlap none
    (the first 32 decode steps at least: no frame is complete before them).
    """
    forward = timers.records.get("forward", [])
    codec = timers.records.get("codec", [])

    def alone(begin: float, seconds: float) -> bool:
        return all(begin + seconds <= c0 or begin >= c0 + cs for c0, cs, _ in codec)

    prefill = [t for _, t, n in forward if n > 1]
    steps = [(b, t) for b, t, n in forward if n == 1]
    quiet = [t for b, t in steps if alone(b, t)]
    emit = [t for _, t, _ in timers.records.get("emit", [])]
    codec_frames = sum(n for _, _, n in codec)
    return {
        "prefill_ms": 1e3 * sum(prefill),
        "prompt_positions": max((n for _, _, n in forward if n > 1), default=0),
        "backbone_step_ms": 1e3 * sum(t for _, t in steps) / max(len(steps), 1),
        "backbone_step_alone_ms": 1e3 * sum(quiet) / max(len(quiet), 1),
        "steps_alone": len(quiet),
        "heads_sampling_ms": 1e3 * sum(emit) / max(len(emit), 1),
        "engine_steps": level.steps,
        "engine_s": sum(t for _, t, _ in forward) + sum(emit),
        "backbone_s": sum(t for _, t, _ in forward),
        # the same with every step at the mean of those that overlapped no codec call
        "backbone_alone_s": sum(prefill) + len(steps) * (sum(quiet) / len(quiet))
        if quiet
        else sum(t for _, t, _ in forward),
        "codec_ms_per_frame": 1e3 * sum(t for _, t, _ in codec) / max(codec_frames, 1),
        "codec_calls": len(codec),
        "codec_chunks": [n for _, _, n in codec] if level.concurrency == 1 else None,
        "codec_s": sum(t for _, t, _ in codec),
    }


def codec_alone(codec: Any, books: int, frames: int, chunks: list[int]) -> dict[str, Any]:
    """The vocoder's codec work for one request with nothing else running: ms per frame."""
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 1024, (1, books, frames), generator=generator)

    def stream() -> None:
        state, at = codec.new_stream(), 0
        for n in chunks:
            codec.stream_rows(codes[..., at : at + n], state)
            at += n

    def one_pass() -> None:
        codec.decode(codes[0].t())

    with torch.inference_mode():
        # Each way once untimed first: the first call at a shape builds oneDNN's
        # kernels and grows the allocator, which the way timed first would pay.
        stream()
        one_pass()
        begin = time.perf_counter()
        stream()
        streamed = time.perf_counter() - begin
        begin = time.perf_counter()
        one_pass()
        whole = time.perf_counter() - begin
    return {
        "streamed_ms_per_frame": 1e3 * streamed / frames,
        "one_pass_ms_per_frame": 1e3 * whole / frames,
    }


def chunk_schedule(frames: int, vocoder: Any) -> list[int]:
    """The vocoder's chunks for ``frames`` frames: its first, growing by its factor."""
    chunks, size, left = [], vocoder.chunk_frames, frames
    while left > 0:
        chunks.append(min(size, left))
        left -= chunks[-1]
        size = min(vocoder.chunk_growth * size, vocoder.max_chunk_frames)
    return chunks


#: How ``ours`` prints its engine's cache (the GPU check quotes it).
CACHE_MARK = "engine cache:"


async def ours(
    model_dir: Path | str,
    frames: int,
    levels: list[int],
    seed: int,
    vocoder_batch: int | None,
    load_format: str = "auto",
    gpu_id: int | None = None,
    dtype: str | None = None,
    quantization: str = "none",
    threads: int | None = None,
    compile_steps: bool = False,
    prepack: bool = False,
    codec_dtype: str | None = None,
    memory_share: float | None = None,
    fp16_row_weights: bool = False,
) -> tuple[list[Level], dict[str, Any], dict[str, Any]]:
    """Our three stages at each concurrency of ``levels``, built by the stages' factories.

    ``model_dir``: a checkpoint directory, or a preset name with ``load_format
    = "dummy"``; ``gpu_id``: the GPU the engine and vocoder go to (None: the CPU);
    ``dtype`` and ``quantization``: the tts_engine stage's ``factory.dtype`` and
    ``factory.quantization``; ``threads``: torch threads for loading and for the
    compute thread, dedicated once loaded as a stage process does;
    ``compile_steps`` / ``prepack``: ``engine.enable_torch_compile`` /
    ``engine.cpu_weight_prepack`` (every bucket compiled while the engine is
    built, before the clock starts); ``codec_dtype``: the vocoder stage's
    ``factory.dtype`` (None: auto, float32; another dtype gives the vocoder a
    codec of its own, as in a stage process, and the engine keeps its float32
    one for encoding); ``memory_share``: the cache sized as a served stage on a
    GPU sizes it (``engine.mem_fraction_static``), not ``1024 + frames``
    positions a request (the CPU: the engine's default ``max_total_tokens``);
    the cache's shape is printed. ``fp16_row_weights``: the tts_engine stage's
    ``factory.fp16_row_weights`` (float16 copies of the blocked bf16 weights). At
    concurrency 1, the decode step in the middle of the request (the most
    codebooks due) counts the bytes of weights it reads (:class:`roofline.StepReads`;
    that step's timings are left out of the breakdown).
    """
    from omni_core.engine.interface import EngineSettings

    path = str(model_dir)
    if threads:  # a round after the first finds this thread dropped to one by dedicate()
        torch.set_num_threads(threads)
    started = time.perf_counter()
    # The preprocessing stage's default cap is generation_config's max_new_tokens (4096).
    pre = stages.create_preprocessing(path)
    # Cache room per request: the prompt (~200 positions with the tiny preset's
    # byte-level tokenizer), the frames, the drain and the stage's text allowance.
    per_request = 1024 + frames
    sizing: dict[str, Any] = {"max_total_tokens": max(levels) * per_request}
    if memory_share is not None:
        sizing = {"mem_fraction_static": memory_share}
    settings = EngineSettings(
        max_running_requests=max(levels),
        enable_torch_compile=compile_steps,
        cpu_weight_prepack=prepack,
        **sizing,
    )
    engine = stages.create_tts_engine(
        path,
        gpu_id=gpu_id,
        engine_settings=settings,
        dtype=dtype,
        load_format=load_format,
        quantization=quantization,
        fp16_row_weights=fp16_row_weights,
    )
    plan = getattr(engine.engine, "plan", None)  # the torch backend's slots
    if plan is not None:
        print(f"{CACHE_MARK} {plan.num_slots} slots of {plan.slot_len} positions ({plan.source})")
    vocoder = stages.create_vocoder(
        path,
        gpu_id=gpu_id,
        load_format=load_format,
        max_batch_size=vocoder_batch,
        dtype=codec_dtype,
    )
    model = engine.model
    codec = vocoder.decoder  # the engine's own where the dtypes agree: one codec per process
    assert model.codec is not None and (codec is model.codec or codec_dtype not in (None, "auto"))
    load = {
        "load_s": time.perf_counter() - started,
        "tensors": len(model.network.state_dict()) + len(model.codec.state_dict()),
        "vocoder_max_batch": vocoder.batcher.max_batch,
        # what the vocoder's codec computes in, read off its weights (bfloat16: the
        # decoder's transformers; its quantizer stays float32)
        "codec_dtype": "bfloat16"
        if any(p.dtype == torch.bfloat16 for p in codec.decoder.parameters())
        else "float32",
    }
    dedicate(threads)  # what a stage process does once built (engine/compute.py)
    watched = ((model, "_forward"), (model, "_emit"), (codec, "stream_rows"))
    try:
        await warm_up(pre, engine, vocoder, model)
        results = []
        counted: dict[str, Any] = {}
        for concurrency in levels:
            if gpu_id is not None and concurrency > 1:
                # On a GPU a batch size's first steps choose kernels (and compile codec
                # shapes): an untimed pass of the same width first (as bench_qwen3_tts).
                await run_level(pre, engine, vocoder, concurrency, min(frames, 16), seed + 5)
            timers = Timers()
            timers.wrap(model, "_forward", "forward", _positions)
            timers.wrap(model, "_emit", "emit", lambda seqs, hidden: len(seqs))
            timers.wrap(codec, "stream_rows", "codec", _codec_frames)
            calls = None
            if concurrency == 1:
                count_reads(model, timers, (frames + 32) // 2, counted)
                calls = CodecWatch(vocoder)
            try:
                run = await run_level(pre, engine, vocoder, concurrency, frames, seed)
            finally:
                for owner, name in (*watched, (model, "decode")):
                    timers.unwrap(owner, name)
                if calls is not None:
                    calls.close()
            run.parts = breakdown(timers, run)
            run.codec_s = calls.per_frame_s() if calls is not None else 0.0
            results.append(run)
            if "ops" in counted:  # the counted step's weight-reading ops, run again alone
                ops = counted.pop("ops")  # they hold the weights
                counted["kernel_ops"] = len(ops)
                counted["kernels_s"] = await run_compute(roofline.kernel_seconds, ops)
                del ops
        parts: dict[str, Any] = {}
        one = next((r for r in results if r.concurrency == 1), None)
        if one is not None:
            chunks = chunk_schedule(frames, vocoder)
            # on the compute thread, with the stage's threads (the loop thread has one)
            alone = await run_compute(codec_alone, codec, model.config.n_vq, frames, chunks)
            parts = {**one.parts, "codec_alone": alone}
            backbone = model.config.backbone
            positions = parts["prompt_positions"] + parts["engine_steps"] / 2
            parts["step_reads"] = {
                "weight_bytes": counted.get("bytes", 0),
                "kernels_s": counted.get("kernels_s", 0.0),
                "kernel_ops": counted.get("kernel_ops", 0),
                "kv_bytes": kv_bytes(
                    backbone.num_hidden_layers,
                    backbone.num_key_value_heads,
                    backbone.head_dim,
                    positions,
                    model.dtype,
                ),
                "dtype": str(model.dtype).removeprefix("torch."),
                "quantization": quantization,
            }
        return results, parts, load
    finally:
        await engine.aclose()


def count_reads(model: MossTTSModel, timers: Timers, call: int, counted: dict[str, Any]) -> None:
    """Count the weight bytes of the model's ``call``-th decode step (0-based) into ``counted``
    (``bytes``), and keep its weight-reading ops (``ops``, :func:`roofline.kernel_seconds`).

    Wraps ``model.decode`` (an instance attribute; ``Timers.unwrap`` removes
    it); the counted step's timer records are dropped, as the counting slows it.
    """
    method = model.decode
    calls = [0]

    @functools.wraps(method)
    def decode(sequences: Any, cache: Any) -> Any:
        index, calls[0] = calls[0], calls[0] + 1
        if index != call:
            return method(sequences, cache)
        kept = {key: len(records) for key, records in timers.records.items()}
        with StepReads(model.network, record=True) as reads:
            out = method(sequences, cache)
        for key in ("forward", "emit"):
            del timers.records.get(key, [])[kept.get(key, 0) :]
        counted["bytes"], counted["ops"] = reads.bytes, reads.ops
        return out

    model.decode = decode  # type: ignore[method-assign]


def _positions(sequences: Any, embeds: list[torch.Tensor], cache: Any) -> int:
    return max(int(e.shape[0]) for e in embeds)


def _codec_frames(codes: torch.Tensor, state: Any) -> int:
    return int(codes.shape[0] * codes.shape[-1])


def release_memory() -> None:
    """Drop the stages' memoised model and codec and hand freed heap back to the system.

    Compiled steps too (``--compile``): dynamo's caches keep every compiled
    graph, and inductor's loaded-module cache keeps each prepacked graph's
    frozen copy of the weights as module attributes, which ``reset()`` leaves
    (measured: 9.6 GB left behind, which starved the reference's process).
    """
    from torch._inductor.codecache import PyCodeCache

    stages.load_model.cache_clear()
    stages.shared_codec.cache_clear()
    torch._dynamo.reset()
    PyCodeCache.cache_clear()
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


# -- the reference ----------------------------------------------------------------------


def reference(
    python: Path,
    root: Path,
    frames: int,
    levels: list[int],
    threads: int,
    seed: int,
    attn: str,
    dtype: str = "float32",
) -> dict[str, Any]:
    job = {
        "model_dir": str(root / "model"),
        "modules_cache": str(root / ".hf_modules"),
        "threads": threads,
        "seed": seed,
        "frames": frames,
        "max_new_tokens": frames + 32,
        "levels": levels,
        "texts": TEXTS,
        "attn_implementation": attn,
        "audio": {"temperature": 1.7, "top_p": 0.8, "top_k": 25},
        "dtype": dtype,
    }
    (root / "job.json").write_text(json.dumps(job))
    done = subprocess.run(
        [str(python), str(RUNNER), str(root / "job.json")],
        capture_output=True,
        text=True,
        check=False,
        env={
            **user_environ(),
            "PYTHONWARNINGS": "ignore",
            "TOKENIZERS_PARALLELISM": "false",
            "TQDM_DISABLE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        },
    )
    if done.returncode != 0:
        # A runner killed by the kernel prints nothing of its own: say how it ended.
        how = f"exit status {done.returncode}"
        if done.returncode == -signal.SIGKILL:
            how = "killed (SIGKILL: most likely out of memory; free some or use --quick)"
        raise RuntimeError(f"the reference runner failed ({how}):\n{done.stderr[-6000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- report -----------------------------------------------------------------------------


def report(
    args: argparse.Namespace,
    levels: list[Level],
    parts: dict[str, Any],
    ref: dict[str, Any] | None,
    prompt_check: str,
    bandwidth: Bandwidth | None = None,
) -> dict[str, Any]:
    seconds = args.frames / FRAME_RATE
    print(
        f"\n{args.frames} frames ({seconds:.2f} s of audio) per request; "
        f"text greedy, audio sampled (T 1.7, top-p 0.8, top-k 25) on both sides; {prompt_check}"
    )
    by_ref = {r["concurrency"]: r for r in ref["levels"]} if ref else {}
    head = (
        f"{'conc':>4} | {'ours: wall s':>12} {'audio s':>7} {'audio s/s':>9} "
        f"{'1st audio s':>11} | {'ref: wall s':>11} {'audio s':>7} {'audio s/s':>9} "
        f"{'1st audio s':>11} | {'speed x':>7} {'1st audio x':>11}"
    )
    print(head)
    print("-" * len(head))
    rows = []
    for level in levels:
        first = sum(level.first_audio_s) / len(level.first_audio_s)
        row: dict[str, Any] = {
            "concurrency": level.concurrency,
            "ours": {
                "wall_s": level.wall_s,
                "audio_s": level.audio_s,
                "audio_s_per_s": level.throughput,
                "first_audio_s_mean": first,
                "first_audio_s_max": max(level.first_audio_s),
                "frames": level.frames,
                "engine_steps": level.steps,
                "codec_chunks": level.codec_chunks,
                "codec_batches": level.codec_batches,
                "prompt_positions": level.prompt,
                "breakdown": level.parts,
            },
        }
        line = (
            f"{level.concurrency:>4} | {level.wall_s:>12.1f} {level.audio_s:>7.2f} "
            f"{level.throughput:>9.3f} {first:>11.2f} | "
        )
        r = by_ref.get(level.concurrency)
        if r is not None:
            ref_speed = r["audio_s"] / r["wall_s"]
            row["reference"] = {**r, "audio_s_per_s": ref_speed, "first_audio_s": r["wall_s"]}
            row["speed_ratio"] = level.throughput / ref_speed
            row["first_audio_ratio"] = first / r["wall_s"]
            line += (
                f"{r['wall_s']:>11.1f} {r['audio_s']:>7.2f} {ref_speed:>9.3f} "
                f"{r['wall_s']:>11.2f} | {row['speed_ratio']:>6.2f}x "
                f"{row['first_audio_ratio']:>10.2f}x"
            )
        else:
            line += f"{'-':>11} {'-':>7} {'-':>9} {'-':>11} | {'-':>7} {'-':>11}"
        print(line)
        rows.append(row)
    print(
        "(speed x: ours / reference audio s per s; 1st audio x: ours / reference time to "
        "first audio, mean over requests; the reference's first audio is its whole audio)"
    )
    if parts:
        alone = parts["codec_alone"]
        print(
            f"\nwhere ours spends a request at concurrency 1 (engine and vocoder are threads "
            f"of one process sharing {args.threads} torch threads, so their times overlap):"
        )
        print(f"  prefill: {parts['prefill_ms']:.0f} ms ({parts['prompt_positions']} positions)")
        print(
            f"  decode step: backbone {parts['backbone_step_ms']:.1f} ms "
            f"({parts['backbone_step_alone_ms']:.1f} ms in the {parts['steps_alone']} steps "
            f"with no codec work alongside) + heads and sampling "
            f"{parts['heads_sampling_ms']:.1f} ms; {parts['engine_steps']} engine steps, "
            f"{parts['engine_s']:.1f} s in the model"
        )
        print(
            f"  codec: {parts['codec_ms_per_frame']:.0f} ms per frame in chunks of "
            f"{parts['codec_chunks']} frames ({parts['codec_s']:.1f} s); the same chunks alone "
            f"{alone['streamed_ms_per_frame']:.0f} ms per frame; one pass over all "
            f"{args.frames} frames alone {alone['one_pass_ms_per_frame']:.0f} ms per frame"
        )
    limit = limit_figures(parts, bandwidth)
    if limit:
        reads = parts["step_reads"]
        print(
            f"\nour decode step at concurrency 1 vs the memory-bandwidth limit ({reads['dtype']}, "
            f"quantization {reads['quantization']}; weights counted op by op in one step in the "
            "middle of a request: the backbone, one embedding row per channel, two rows of the "
            "text head, the audio heads of the codebooks due; KV at the mean cached length; the "
            "step: backbone + heads and sampling):"
        )
        step_s = (parts["backbone_step_ms"] + parts["heads_sampling_ms"]) / 1e3
        alone_s = (parts["backbone_step_alone_ms"] + parts["heads_sampling_ms"]) / 1e3
        assert bandwidth is not None
        print(
            "  " + limit_line("ours", reads["weight_bytes"], reads["kv_bytes"], step_s, bandwidth)
        )
        print(
            f"    (steps with no codec work alongside, {alone_s * 1e3:.1f} ms: "
            f"{limit['percent_alone']:.0f}%)"
        )
        if reads.get("kernels_s"):
            line = roofline.kernels_line(
                reads["kernel_ops"], reads["weight_bytes"], reads["kernels_s"], step_s, bandwidth
            )
            print("  " + line)
    for level in levels:
        p = level.parts
        print(
            f"ours at concurrency {level.concurrency}: {level.steps} engine steps, "
            f"{p['backbone_step_ms']:.0f} ms backbone + {p['heads_sampling_ms']:.0f} ms heads "
            f"and sampling per step ({p['backbone_step_alone_ms']:.0f} ms backbone in the "
            f"{p['steps_alone']} steps with no codec work alongside; {p['engine_s']:.1f} s in "
            "the model); codec "
            f"{p['codec_s']:.1f} s, {level.codec_chunks} chunks in {level.codec_batches} "
            f"batches, {p['codec_ms_per_frame']:.0f} ms per frame; prompt positions "
            f"{level.prompt.get('computed', 0)} computed, {level.prompt.get('cached', 0)} "
            "copied from the template another request computed (engine.disable_radix_cache)"
        )
    if ref:
        for r in ref["levels"]:
            print(
                f"reference at concurrency {r['concurrency']}: processor {r['processor_s']:.2f} s, "
                f"generate {r['generate_s']:.1f} s ({r['steps']} steps, "
                f"{1e3 * r['generate_s'] / max(r['steps'], 1):.0f} ms/step, of which backbone "
                f"{1e3 * r['backbone_s'] / max(r['steps'], 1):.0f} ms; prefill "
                f"{1e3 * r['prefill_s']:.0f} ms over {r['prompt_positions']} positions), "
                f"codec decode {r['decode_s']:.1f} s "
                f"({1e3 * r['decode_s'] / max(sum(r['frames']), 1):.1f} ms per frame); "
                f"frames {sorted(set(r['frames']))}"
            )
    projection = projected_rows(levels, by_ref, args.layers)
    ours_frames = sorted({f for level in levels for f in level.frames})
    line = f"\nframes per request: ours {ours_frames}"
    if ref:
        ref_frames = sorted({f for r in ref["levels"] for f in r["frames"]})
        slots = sorted({g for r in ref["levels"] for g in r["gen_slots"]})
        line += f", reference {ref_frames} (its text: audio_start, then {slots} gen slots)"
        if ref_frames != [args.frames]:
            line += " -- NOT the same work on both sides"
    if ours_frames != [args.frames]:
        line += " -- ours did not make the requested frames"
    print(line)
    by = {row["concurrency"]: row for row in rows}
    verdicts: dict[str, bool] = {}
    if "speed_ratio" in by.get(1, {}):
        verdicts["speed_c1"] = by[1]["speed_ratio"] >= 1.0
        verdicts["first_audio_c1"] = by[1]["first_audio_ratio"] < 0.25
    if "speed_ratio" in by.get(8, {}):
        verdicts["speed_c8"] = by[8]["speed_ratio"] >= 3.0

    def said(key: str) -> str:
        if key not in verdicts:
            return "not measured"
        return "met" if verdicts[key] else "NOT met"

    if verdicts:
        print(
            f"\ntargets: >= 1x at concurrency 1: {said('speed_c1')}; >= 3x at concurrency 8: "
            f"{said('speed_c8')}; first audio at concurrency 1 under 1/4 of the reference's: "
            f"{said('first_audio_c1')}"
        )
        if projection:
            ratios = ", ".join(f"{p['speed_ratio']:.2f}x at {p['concurrency']}" for p in projection)
            print(f"  projected to {RELEASE_LAYERS} layers: {ratios}")
    return {
        "rows": rows,
        "projected_release_layers": projection,
        "ours_breakdown": parts,
        "targets_met": verdicts,
        "bandwidth_limit": limit,
    }


def projected_wall(wall_s: float, backbone_s: float, layers: int) -> float:
    """A side's wall time with the release's layers, from a run with ``layers``.

    The backbone's time (prefill and every step, measured around the whole
    network, so its embedding and final norm scale too: a little high on both
    sides) grows by ``RELEASE_LAYERS / layers``; the text and audio heads,
    sampling and the codec stay as measured, since their cost does not grow
    with depth. Ours runs engine and codec as threads on the same cores, and
    a step that overlaps a codec call is slower for it: ours passes its steps
    at the mean of those that overlapped none (``backbone_alone_s``), as the
    reference's, which decodes after generating, are measured, since at the
    release's depth the codec's calls overlap few of the steps.
    """
    return wall_s + backbone_s * (RELEASE_LAYERS / layers - 1)


def projected_rows(
    levels: list[Level], by_ref: dict[int, dict[str, Any]], layers: int
) -> list[dict[str, Any]]:
    """Each level's speed ratio projected to the release's depth (empty at that depth or
    without the reference), printed as a table."""
    if layers >= RELEASE_LAYERS or not by_ref:
        return []
    rows = []
    for level in levels:
        r = by_ref.get(level.concurrency)
        if r is None:
            continue
        ours = projected_wall(level.wall_s, level.parts["backbone_alone_s"], layers)
        ref = projected_wall(r["wall_s"], r["backbone_s"], layers)
        rows.append(
            {
                "concurrency": level.concurrency,
                "ours_wall_s": ours,
                "reference_wall_s": ref,
                "speed_ratio": (level.audio_s / ours) / (r["audio_s"] / ref),
            }
        )
    if rows:
        print(
            f"\nthe same projected to the release's {RELEASE_LAYERS} layers (each side's backbone "
            f"time, prefill and steps, x {RELEASE_LAYERS}/{layers}; heads, sampling and the codec "
            "as measured):"
        )
        print(f"{'conc':>4} | {'ours: wall s':>12} | {'ref: wall s':>11} | {'speed x':>7}")
        for row in rows:
            print(
                f"{row['concurrency']:>4} | {row['ours_wall_s']:>12.1f} | "
                f"{row['reference_wall_s']:>11.1f} | {row['speed_ratio']:>6.2f}x"
            )
    return rows


def limit_figures(parts: dict[str, Any], bandwidth: Bandwidth | None) -> dict[str, Any] | None:
    """The concurrency-1 step against the limit, for BENCH_JSON (None: not measured)."""
    reads = parts.get("step_reads")
    if bandwidth is None or not reads or not reads["weight_bytes"]:
        return None
    floor_ms = (reads["weight_bytes"] + reads["kv_bytes"]) / (bandwidth.gb_s * 1e9) * 1e3
    step_ms = parts["backbone_step_ms"] + parts["heads_sampling_ms"]
    alone_ms = parts["backbone_step_alone_ms"] + parts["heads_sampling_ms"]
    return {
        "gb_s": bandwidth.gb_s,
        "lowest_gb_s": bandwidth.lowest_gb_s,
        "how": bandwidth.how,
        "threads": bandwidth.threads,
        "weight_bytes": reads["weight_bytes"],
        "kv_bytes": reads["kv_bytes"],
        "floor_ms": floor_ms,
        "step_ms": step_ms,
        "kernels_ms": 1e3 * reads.get("kernels_s", 0.0),
        "percent": 100 * floor_ms / step_ms,
        "percent_alone": 100 * floor_ms / alone_ms,
        "sustained_gb_s": bandwidth.sustained_gb_s,
        "percent_sustained": (
            None
            if bandwidth.sustained_gb_s is None
            else 100 * floor_ms * bandwidth.gb_s / bandwidth.sustained_gb_s / step_ms
        ),
    }


def prompts_agree(model_dir: Path, ref: dict[str, Any] | None) -> str:
    """Our prompt builder's text channel vs the reference processor's, for every text."""
    if not ref:
        return "reference prompts not compared"
    from omni_moss_tts.loading import read_config
    from omni_moss_tts.prompt import PromptBuilder
    from omni_qwen3_tts.tokenizer import TextTokenizer

    config, _ = read_config(model_dir)
    builder = PromptBuilder(config, TextTokenizer.from_dir(model_dir))
    ours_ids = [builder.build(t, max_frames=1).ids[:, 0].tolist() for t in TEXTS]
    if ours_ids == ref["prompt_text_ids"]:
        lengths = sorted({len(i) for i in ours_ids})
        return f"prompts identical on both sides ({lengths[0]}-{lengths[-1]} positions)"
    return "PROMPTS DIFFER between the two sides (the comparison is not like for like)"


def smoke(args: argparse.Namespace) -> None:
    """``--smoke``: the same measuring and reporting code on the tiny preset, ours alone."""
    args.frames, args.repeats = 4, 1
    levels = [1, 2]
    bandwidth = read_bandwidth(16, 1)
    levels_run, parts, load = anyio.run(
        functools.partial(
            ours,
            "tiny",
            args.frames,
            levels,
            args.seed,
            args.vocoder_max_batch,
            "dummy",
            dtype=args.dtype,
            quantization=args.quantization,
            fp16_row_weights=args.fp16_row_weights,
            threads=args.threads,
            compile_steps=args.compile,
            prepack=args.cpu_weight_prepack,
            codec_dtype=args.codec_dtype,
        )
    )
    print(
        f"MOSS-TTS tiny preset, dummy weights, {args.dtype} (quantization {args.quantization}, "
        f"codec {load['codec_dtype']}), "
        f"cpu, {args.threads} torch threads (--smoke: ours alone); loaded {load['tensors']} "
        f"tensors in {load['load_s']:.1f} s"
    )
    release_memory()
    bandwidth = best(bandwidth, read_bandwidth(16, 1))
    check = prompts_agree(Path("tiny"), None)
    figures = report(args, levels_run, parts, None, check, bandwidth)
    print("BENCH_JSON " + json.dumps({"smoke": True, "frames": args.frames, **figures}))


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a mistake exits 2 (argparse) before anything is
    built or measured, and the tests call this in-process rather than start the
    script for each mistake (2 s of start-up each)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="backbone layers (the release: 36)")
    parser.add_argument("--frames", type=int, default=None, help="frames per request (12.5/s)")
    parser.add_argument("--levels", default=None, help="concurrency levels (default 1,4,8)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: levels 1,4; 25 frames")
    parser.add_argument("--reference-python", type=Path, default=DEFAULT_REF_PYTHON)
    parser.add_argument("--reference-src", type=Path, default=DEFAULT_REF_SRC)
    parser.add_argument(
        "--reference-attn",
        default="sdpa",
        choices=("sdpa", "eager"),
        help="the reference backbone's attn_implementation (its README's CPU choice is eager)",
    )
    parser.add_argument("--no-reference", action="store_true", help="measure ours only")
    parser.add_argument(
        "--rounds",
        "--repeats",
        dest="repeats",
        metavar="N",
        type=int,
        default=None,
        help="rounds (ours, then the reference), each level's fastest run kept per side: "
        "the machine is shared and noisy (default 2; 1 with --quick); --rounds as the "
        "other model benchmarks spell it",
    )
    parser.add_argument(
        "--vocoder-max-batch",
        type=int,
        default=None,
        help="the vocoder stage's factory.max_batch_size: chunks of concurrent requests "
        "decoded as one batch (default: the stage's)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the checkpoint here and reuse it on the next run (default: a temporary "
        "directory, removed at the end; about 14 GB at 2 layers)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="our backbone's dtype, the tts_engine stage's factory.dtype (bfloat16: fast on "
        "CPUs with AMX / AVX512-BF16; the checkpoint stays float32)",
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="none",
        help="the tts_engine stage's factory.quantization: int8 weight-only backbone layers, "
        "the heads not (needs --dtype bfloat16); w8a8_int8: int8 activations too",
    )
    parser.add_argument(
        "--fp16-row-weights",
        action="store_true",
        help="the tts_engine stage's factory.fp16_row_weights: float16 copies of the blocked "
        "bf16 backbone weights for one- and two-row products (needs --dtype bfloat16)",
    )
    parser.add_argument(
        "--reference-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the dtype the reference's model runs in (cast after its strict load; its codec "
        "stays float32)",
    )
    parser.add_argument(
        "--codec-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="our vocoder stage's factory.dtype (float32: auto, the release's; bfloat16 runs "
        "the codec decoder's transformers in bf16, ~0.7%% from float32); the reference's codec "
        "stays float32",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="ours with engine.enable_torch_compile (the backbone's decode step compiled per "
        "batch-size bucket while the engine is built; each round builds it again)",
    )
    parser.add_argument(
        "--cpu-weight-prepack",
        action="store_true",
        help="with --compile: engine.cpu_weight_prepack (bf16 weights that fit the CPU's "
        "last-level cache, and int8 ones, packed for inductor's GEMM template)",
    )
    parser.add_argument("--write-checkpoint", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the tiny preset (dummy weights), 4 frames, concurrency 1 and 2, ours alone: "
        "checks the script runs (make test)",
    )
    args = parser.parse_args(argv)
    if args.cpu_weight_prepack and not args.compile:
        parser.error("--cpu-weight-prepack packs weights into compiled steps: add --compile")
    problem = quantization_problem(
        args.quantization, getattr(torch, args.dtype), torch.device("cpu")
    )
    if problem is not None:
        parser.error(f"--quantization {args.quantization}: {problem}")
    if args.fp16_row_weights and (args.dtype != "bfloat16" or args.quantization != "none"):
        parser.error("--fp16-row-weights copies bf16 weights: add --dtype bfloat16, without int8")
    return args


def main() -> None:
    ask_for_huge_pages()  # as omni's CPU stage processes (plan/pages.py); ours only
    args = arguments()
    torch.set_num_threads(args.threads)
    if args.write_checkpoint is not None:
        info = write_checkpoint(args.write_checkpoint, args.layers, args.seed, args.reference_src)
        print(
            f"checkpoint: {info['backbone_params'] / 1e6:.0f} M backbone + "
            f"{info['codec_params'] / 1e6:.0f} M codec parameters, built in "
            f"{info['build_s']:.1f} s, saved ({info['bytes'] / 1e9:.1f} GB) in "
            f"{info['save_s']:.1f} s"
        )
        return
    if args.smoke:
        return smoke(args)
    args.frames = args.frames or (25 if args.quick else 50)
    levels = [int(c) for c in (args.levels or ("1,4" if args.quick else "1,4,8")).split(",")]
    args.repeats = args.repeats or (1 if args.quick else 2)
    use_reference = not args.no_reference
    if use_reference and not args.reference_python.exists():
        raise SystemExit(
            f"no reference environment at {args.reference_python} (make moss-reference-env, "
            "see plugins/moss_tts/tests/REFERENCE.md), or run with --no-reference"
        )
    run_started = time.perf_counter()
    temporary = None
    if args.workdir is None:
        temporary = tempfile.TemporaryDirectory(prefix="moss-tts-bench-")
        root = Path(temporary.name)
    else:
        root = args.workdir.resolve()
        root.mkdir(parents=True, exist_ok=True)
    try:
        info = ensure_checkpoint(root, args.layers, args.seed, args.reference_src)
        bandwidth = read_bandwidth()
        print(
            f"MOSS-TTS at 8B width (hidden 4096, 32/8 heads of 128, intermediate 12288, "
            f"vocab 151936, 32 codebooks), {args.layers} of 36 layers, real codec; dummy "
            f"weights (float32 checkpoint), ours {args.dtype} (quantization "
            f"{args.quantization}{', compiled' if args.compile else ''}"
            f"{', float16 row copies' if args.fp16_row_weights else ''}"
            f"{', prepacked' if args.cpu_weight_prepack else ''}; codec {args.codec_dtype}), "
            f"reference "
            f"{args.reference_dtype}, cpu, {args.threads} torch threads: "
            f"{info['backbone_params'] / 1e6:.0f} M backbone + {info['codec_params'] / 1e6:.0f} M "
            f"codec parameters ({'reused ' + str(root) if info['reused'] else 'written'})"
        )
        rounds: list[tuple[list[Level], dict[str, Any]]] = []
        refs: list[dict[str, Any]] = []
        loads: list[dict[str, Any]] = []
        failed = False
        for attempt in range(args.repeats):
            # Rounds alternate the sides, so that a slow spell of the shared machine
            # does not fall on one side only; each level keeps its fastest run.
            tag = f"round {attempt + 1}/{args.repeats}"

            def run_ours(tag: str = tag) -> None:
                levels_run, parts, load = anyio.run(
                    functools.partial(
                        ours,
                        root / "model",
                        args.frames,
                        levels,
                        args.seed,
                        args.vocoder_max_batch,
                        dtype=args.dtype,
                        quantization=args.quantization,
                        fp16_row_weights=args.fp16_row_weights,
                        threads=args.threads,
                        compile_steps=args.compile,
                        prepack=args.cpu_weight_prepack,
                        codec_dtype=args.codec_dtype,
                    )
                )
                rounds.append((levels_run, parts))
                loads.append(load)
                print(
                    f"{tag}, ours: loaded {load['tensors']} tensors strictly (load_format auto) "
                    f"in {load['load_s']:.1f} s; vocoder max batch {load['vocoder_max_batch']}; "
                    + ", ".join(f"c{r.concurrency} {r.wall_s:.1f} s" for r in levels_run)
                )
                release_memory()

            # With --compile the reference's process runs first: whatever compiled graphs
            # keep that release_memory() does not find would be taken from it (a round
            # once left 9.6 GB behind and the reference was killed for memory).
            if not args.compile:
                run_ours()
            if use_reference and not failed:
                try:
                    one = reference(
                        args.reference_python,
                        root,
                        args.frames,
                        levels,
                        args.threads,
                        args.seed,
                        args.reference_attn,
                        args.reference_dtype,
                    )
                except RuntimeError as exc:  # still print ours
                    print(exc, file=sys.stderr)
                    failed = True
                else:
                    refs.append(one)
                    print(
                        f"{tag}, reference: transformers {one['transformers']}, "
                        f"attn_implementation {one['attn_implementation']}, "
                        f"{one.get('dtype', 'float32')}; loaded {one['tensors']} tensors of our "
                        f"checkpoint strictly (equal to the files) in {one['load_s']:.1f} s; "
                        + ", ".join(
                            f"c{r['concurrency']} {r['wall_s']:.1f} s" for r in one["levels"]
                        )
                    )
            if args.compile:
                run_ours()
        print(f"after freeing ours, this process holds {rss_gb():.1f} GB")
        levels_run = [
            min((r[0][i] for r in rounds), key=lambda level: level.wall_s)
            for i in range(len(levels))
        ]
        # the concurrency-1 breakdown of the round whose concurrency-1 run was kept
        parts = {}
        for run, round_parts in rounds:
            if any(r.concurrency == 1 and any(r is kept for kept in levels_run) for r in run):
                parts = round_parts
        ref = None
        if refs:
            ref = {
                **refs[0],
                "levels": [
                    min((r["levels"][i] for r in refs), key=lambda level: level["wall_s"])
                    for i in range(len(levels))
                ],
            }
        bandwidth = best(bandwidth, read_bandwidth())  # at the end too: the higher is kept
        check = prompts_agree(root / "model", ref)
        figures = report(args, levels_run, parts, ref, check, bandwidth)
        wall = time.perf_counter() - run_started
        print(f"\nwhole run: {wall:.0f} s")
        summary = {
            "layers": args.layers,
            "frames": args.frames,
            "audio_seconds_per_request": args.frames / FRAME_RATE,
            "threads": args.threads,
            "dtype": args.dtype,
            "quantization": args.quantization,
            "fp16_row_weights": args.fp16_row_weights,
            "codec_dtype": args.codec_dtype,
            "reference_dtype": args.reference_dtype,
            "reference_attn": ref["attn_implementation"] if ref else None,
            "repeats": args.repeats,
            "vocoder_max_batch": loads[-1]["vocoder_max_batch"],
            "rounds": {
                "ours_wall_s": [[r.wall_s for r in run] for run, _ in rounds],
                "reference_wall_s": [[r["wall_s"] for r in one["levels"]] for one in refs],
            },
            "reference_memory_gb": ref["memory_gb"] if ref else None,
            "run_s": wall,
            **figures,
        }
        print("BENCH_JSON " + json.dumps(summary))
        if failed:
            raise SystemExit("the reference failed: no ratios")
    finally:
        if temporary is not None:
            temporary.cleanup()


if __name__ == "__main__":
    run_script(main)
