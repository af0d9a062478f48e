"""Qwen3-Omni speaking at real width through the whole served graph, on the CPU: ours vs reference.

Run: ``python benchmarks/bench_qwen3_omni_speech.py [--frames 32] [--threads 1]``
(about 4-5 minutes on two CPU cores; the reference peaks at about 11 GiB, our
seven processes hold about 12 GiB together, one side after the other; the
checkpoint takes 11 GB of disk while it runs). Without the reference
environment it prints ``skipped`` and exits 0.

The model: the release's widths with few layers. Thinker as in
``bench_qwen3_omni_thinker.py`` (hidden 2048, 128 experts top-8, vocabulary
152064, M-RoPE [24, 20, 20]; ``--layers`` of 48 decoder layers, vision tower
width 1152 with ``--vision-depth`` of 27 blocks), the audio tower at width 1280
with 2 of 32 layers, ``accept_hidden_layer`` half the thinker's layers (the
release: 24 of 48); the talker at its release width (hidden 1024, 16 query / 2
KV heads of 128, 128 experts top-6 of width 384 plus a gated shared expert of
768, codec vocabulary 3072) with ``--talker-layers`` of 20 layers and its code
predictor whole (5 layers, width 1024, 16 code groups of 2048); code2wav at
its release width (transformer 1024 wide with ``--code2wav-layers`` of 8
layers, the whole upsampler and SnakeBeta decoder of width 1536: 1920 samples
per frame at 24 kHz). Float32 unless ``--dtype`` / ``--reference-dtype``
say bfloat16 (the checkpoint is written in float32 either way and each side
casts it as it loads, as ``from_pretrained(dtype=...)`` does; code2wav
follows ``--dtype`` unless ``--code2wav-dtype`` says otherwise, since the
release casts it with the rest); ``--quantization int8`` makes the thinker's
and the talker's linear layers int8 weight-only (their stages'
``factory.quantization``, bf16 only), and ``--fp16-row-weights`` gives their
blocked bf16 weights float16 copies for one- and two-row products
(``factory.fp16_row_weights``). The same ``--threads`` torch threads per
process on both sides.

Same weights: the reference runner (``qwen3_omni_speech_reference_runner.py``,
in the reference environment, default ``/tmp/qwen-tts-ref/bin/python``)
builds transformers' ``Qwen3OmniMoeForConditionalGeneration`` from this
script's config, fills every parameter by name with the thinker benchmark's
seeded ``fill_parameter`` (code2wav: the damped values of
``plugins/qwen3_omni/tests/reference/code2wav_reference.py``, which keep the
waveform out of the clamp), zeroes the end-of-turn rows of the thinker's LM head
and the codec-EOS row of the talker's head (so every answer runs exactly
``--tokens`` tokens and ``--frames`` frames on both sides) and writes the
checkpoint directory once (``save_pretrained``, safetensors, plus the tiny
preset's tokenizer files, about 10 GB at the defaults, in a temporary
directory removed at the end). Then:

* the reference, in that process: ``generate(return_audio=True)`` on each of
  ``--reference-requests`` requests, one after another: with audio output it
  takes one request at a time, and it returns the waveform at the end, so
  its first audio is all its audio. Its figures at concurrency ``c`` are
  those of ``c`` requests served one after another (measured per request,
  added up): first audio after ``(c + 1) / 2`` requests' time on average,
  throughput independent of ``c``;
* ours: the ``qwen3-omni`` pipeline planned with ``--placement.policy cpu``
  (seven processes: preprocessing, the two encoders, the thinker, decode,
  the talker, code2wav; each loads its part from the checkpoint,
  ``load_format = "safetensors"``, ``dtype = "float32"``), started as
  ``omni serve`` starts it; requests as a client sends them (chat messages,
  ``modalities`` text + audio, a ``voice``), ``c`` at once at each level.
  Time to first audio: from submit to the first audio chunk out of code2wav
  (its defaults: a first chunk of 4 frames, then 8, 16, ...); real-time
  factor: wall time per request over its audio seconds; throughput: audio
  seconds of the level over its wall time (first submit to last chunk).
  One full request warms the graph up first (``--warm-each-level``: and
  an untimed pass of each level's width before it).

Requests: a chat turn of text (no media: the encoders load and wait, as in a
deployment, but take no part), ``--tokens`` answer tokens, ``--frames``
frames (80 ms each); sampling: the thinker as ``generation_config.json``
says (top-k 20, top-p 0.8, temperature 0.7, repetition penalty 1.05: what our
preprocessing defaults to; passed to the reference's ``generate`` explicitly,
as its thinker does not read that file), the talker and code predictor as the
reference's ``generate`` does by default (top-k 50, temperature 0.9,
repetition penalty 1.05; top-k 50, top-p 0.8), each request with its own
seed, or with ``--greedy``
greedy everywhere (the reference's code predictor forced greedy), when the
two sides' waveforms are compared too (relative L2; they agree unless
rounding flips a near-tie somewhere along the way).

Also printed: the CPU seconds each of our processes used per wall second of
each level (which stage holds a core: on two cores, the talker's code
predictor), the memory each holds, and sanity checks (frames, samples,
answer and prompt token counts on both sides).

``--smoke``: ours alone on ``examples/qwen3_omni_demo.toml`` (the tiny preset,
dummy weights, the same seven processes), 4 tokens and 4 frames at
concurrency 1 and 2: it checks that the script still runs (``make test``).

Threads: default 1 per process, set through ``OMP_NUM_THREADS`` for the
runtime's children (the runtime sets none of its own). Our seven processes
share the machine's cores; the reference is one process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from omni_core.sigterm import run_script

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "qwen3_omni_speech_reference_runner.py"
SAMPLE_RATE, SAMPLES_PER_FRAME, LOOKAHEAD = 24000, 1920, 555
LEVELS = (1, 4, 8)
SPEAKERS = ("ethan", "chelsie", "aiden")
TEXTS = [
    "Tell me about the weather today.",
    "What is a good name for a cat?",
    "Describe the sea at night.",
    "How do trains work?",
    "Sing me something short.",
    "Why is the sky blue?",
    "Count from one to five.",
    "What should I cook tonight?",
    "Say hello to my friend.",
]
LOADED = ("image_encoder", "audio_encoder", "thinker", "talker_ar", "code2wav")


# -- the model ----------------------------------------------------------------------


def root_config(args: argparse.Namespace) -> dict[str, Any]:
    """The root ``config.json`` at the release's widths, with fewer layers."""
    # Here, not at the top: the runtime's children import this script again.
    from bench_qwen3_omni_thinker import IDS as THINKER_IDS
    from bench_qwen3_omni_thinker import sections

    parts = sections(args.layers, args.vision_depth)
    media = {
        **{k: v for k, v in THINKER_IDS.items() if k != "user_token_id"},
        "audio_end_token_id": 151670,
        "vision_end_token_id": 151653,
        "seconds_per_chunk": 2,
    }
    thinker = {
        **media,
        "user_token_id": 872,
        "text_config": parts["text"],
        "vision_config": parts["vision"],
        "audio_config": {
            "num_mel_bins": 128,
            "d_model": 1280,
            "encoder_layers": 2,
            "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120,
            "downsample_hidden_size": 480,
            "output_dim": 2048,
            "n_window": 50,
            "n_window_infer": 800,
            "conv_chunksize": 500,
            "max_source_positions": 1500,
        },
    }
    layer = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 65536}
    talker = {
        **media,
        "thinker_hidden_size": 2048,
        "accept_hidden_layer": max(1, args.layers // 2),
        "num_code_groups": 16,
        "spatial_merge_size": 2,
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
        "text_config": {
            **layer,
            "vocab_size": 3072,
            "hidden_size": 1024,
            "intermediate_size": 2048,
            "num_hidden_layers": args.talker_layers,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 128,
            "rope_theta": 1_000_000.0,
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [24, 20, 20],
                "interleaved": True,
            },
            "moe_intermediate_size": 384,
            "shared_expert_intermediate_size": 768,
            "num_experts": 128,
            "num_experts_per_tok": 6,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
        "code_predictor_config": {
            **layer,
            "vocab_size": 2048,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 5,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "rope_theta": 1_000_000.0,
            "num_code_groups": 16,
        },
    }
    code2wav = {
        "codebook_size": 2048,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": args.code2wav_layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "sliding_window": 72,
        "num_quantizers": 16,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 1536,
    }
    return {
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "enable_audio_output": True,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "system_token_id": 8948,
        "user_token_id": 872,
        "assistant_token_id": 77091,
        "thinker_config": thinker,
        "talker_config": talker,
        "code2wav_config": code2wav,
    }


def make_requests(count: int, seed: int) -> list[dict[str, Any]]:
    return [
        {
            "messages": [{"role": "user", "content": TEXTS[i % len(TEXTS)]}],
            "speaker": SPEAKERS[i % len(SPEAKERS)],
            "seed": seed + i,
        }
        for i in range(count)
    ]


# -- the reference ------------------------------------------------------------------


def run_reference(python: Path, job: dict[str, Any], workdir: Path) -> dict[str, Any]:
    (workdir / "job.json").write_text(json.dumps(job))
    started = time.perf_counter()
    done = subprocess.run(
        [str(python), str(RUNNER), str(workdir / "job.json"), str(workdir / "out.json")],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "PYTHONWARNINGS": "ignore",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": str(job["threads"]),
        },
    )
    if done.returncode != 0:
        raise RuntimeError(f"the reference runner failed:\n{done.stderr[-4000:]}")
    result = json.loads((workdir / "out.json").read_text())
    result["wall_s"] = time.perf_counter() - started
    npz = workdir / "out.npz"
    if npz.exists():
        with np.load(npz) as wavs:
            result["wavs"] = [wavs[f"request_{i}"] for i in range(len(result["runs"]))]
    return result


# -- ours ---------------------------------------------------------------------------


@dataclass
class Answer:
    submitted: float
    first_audio: float | None = None
    done: float | None = None
    samples: int = 0
    frames: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks: int = 0
    wav: np.ndarray | None = None

    @property
    def ttfa_s(self) -> float:
        assert self.first_audio is not None
        return self.first_audio - self.submitted

    @property
    def wall_s(self) -> float:
        assert self.done is not None
        return self.done - self.submitted

    @property
    def audio_s(self) -> float:
        return self.samples / SAMPLE_RATE


@dataclass
class Level:
    concurrency: int
    answers: list[Answer]
    wall_s: float

    def throughput(self) -> float:
        return sum(a.audio_s for a in self.answers) / self.wall_s


def client_request(request: dict[str, Any], tokens: int, greedy: bool) -> dict[str, Any]:
    if greedy:
        sampling = {"temperature": 0, "repetition_penalty": 1.0}
    else:
        sampling = {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}
    return {
        "messages": request["messages"],
        "sampling": {"max_tokens": tokens, "seed": request["seed"], **sampling},
        "modalities": ["text", "audio"],
        "voice": request["speaker"],
    }


async def speak(runtime: Any, data: dict[str, Any], keep: bool) -> Answer:
    answer = Answer(time.perf_counter())
    chunks = []
    handle = await runtime.dispatch(data)
    async for event in handle.stream():
        if event.stage == "code2wav" and not event.final:
            if answer.first_audio is None:
                answer.first_audio = time.perf_counter()
            answer.chunks += 1
            if keep:
                chunks.append(np.asarray(event.data))
        elif event.stage == "code2wav":
            answer.done = time.perf_counter()
            answer.samples, answer.frames = event.data["samples"], event.data["frames"]
        elif event.stage == "decode" and event.final:
            usage = event.data["usage"]
            answer.prompt_tokens = usage["prompt_tokens"]
            answer.completion_tokens = usage["completion_tokens"]
    if keep:
        answer.wav = np.concatenate(chunks)
    return answer


def process_status(pid: int) -> dict[str, float]:
    """CPU seconds so far, resident anonymous memory and peak resident memory of ``pid``.

    The peak (``VmHWM``) also counts the checkpoint's pages a process mapped
    while loading; ``RssAnon`` is what it holds (weights, caches, state).
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    status = {"cpu_s": (int(fields[11]) + int(fields[12])) / ticks}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmHWM", "RssAnon"):
            status[key] = int(line.split()[1]) * 1024
    return status


#: The stages whose linear layers ``--quantization`` makes int8 (their factory.quantization).
QUANTIZED = ("thinker", "talker_ar")
ENGINE_STAGES = ("thinker", "talker_ar")  # the stages an engine runs (their batches form there)


def precision_flags(args: argparse.Namespace) -> list[str]:
    """Each model stage's ``factory.dtype`` (code2wav's its own) and the decoders' quantization."""
    flags = []
    for stage in LOADED:
        dtype = args.code2wav_dtype if stage == "code2wav" else args.dtype
        flags += [f"--{stage}.factory.dtype", dtype]
    for stage in QUANTIZED:
        flags += [f"--{stage}.factory.quantization", args.quantization]
        if args.fp16_row_weights:
            flags += [f"--{stage}.factory.fp16_row_weights", "true"]
    return flags


def checkpoint_flags(ckpt: Path, args: argparse.Namespace) -> list[str]:
    """Every model stage loads its part of ``ckpt`` strictly, in the dtypes ``args`` name."""
    flags = ["--model-path", str(ckpt), "--talker_ar.factory.max_frames", str(args.frames)]
    for stage in LOADED:
        flags += [f"--{stage}.factory.load_format", "safetensors"]
    return flags + precision_flags(args)


def precision(args: argparse.Namespace) -> str:
    """Our side's precision in words, for the headers."""
    said = args.dtype
    if args.code2wav_dtype != args.dtype:
        said += f" (code2wav {args.code2wav_dtype})"
    if args.quantization != "none":
        said += f", thinker and talker {args.quantization}"
    if args.fp16_row_weights:
        said += ", thinker and talker with float16 row copies"
    return said


def whole_log(child: Any) -> str:
    """A stage process's whole log (its startup lines are long gone from the tail)."""
    try:
        return Path(child.log_path).read_text(errors="replace")
    except OSError:
        return child.log_tail()  # a process another host runs: what it sends back


def engine_lines(log: str) -> list[str]:
    """What a stage process's engine said of its static steps: compiled or captured buckets,
    how long they took, and why one was not captured (its ``engine:`` log lines); and what
    its code2wav said of its chunks (``code2wav:``, captured as CUDA graphs or why not)."""
    marks = ("engine:", "code2wav:")
    return [line.strip() for line in log.splitlines() if line.startswith(marks)]


def engine_report(ours: dict[str, Any]) -> str | None:
    """Each engine stage's static decode steps as its log told them, or None (all eager)."""
    lines = [
        f"  {name}: {line.removeprefix('engine: ')}"
        for name, said in ours["engine"].items()
        for line in said
    ]
    return "static decode steps, as each stage's log says:\n" + "\n".join(lines) if lines else None


async def measure_ours(
    base: Path,
    args: argparse.Namespace,
    requests: list[dict[str, Any]],
    flags: list[str],
    deploy: Path | None = None,
    policy: str | None = "cpu",
) -> dict[str, Any]:
    """The qwen3-omni graph planned with ``flags`` (and ``deploy``), driven as a client
    drives it, at each of ``args.levels``. ``policy``: the placement policy (``cpu``: every
    stage off the GPU; None: the deployment's own, as ``benchmarks/gpu_check.py`` uses it)."""
    from omni_core.harness import plan_on_cpu
    from omni_core.plugins import OmniPlugins

    # every level's requests are in flight at once: the default admission limit (8) would
    # refuse the rest of a wider level (the GPU check's c=32) as overloaded, and the engine
    # stages' default of 8 running sequences would queue them (the GPU check's first c=32
    # run: first audio 4.9 s, no more audio a second than at c=8), measuring the default,
    # not the engine. Each level runs as one batch, as the peers' figures do.
    widest = str(max(8, *args.levels))
    flags = [*flags, "--runtime.max_inflight", widest]
    for stage in ENGINE_STAGES:
        flags += [f"--{stage}.engine.max_running_requests", widest]
    planned = plan_on_cpu(
        OmniPlugins(env={}), base, pipeline="qwen3-omni", deploy=deploy, flags=flags, policy=policy
    )
    # What the plan resolved, not what was asked: printed, so a flag that did not
    # reach a stage shows.
    resolved = {}
    for name in LOADED:
        factory = planned.config.stage(name).factory
        resolved[name] = (getattr(factory, "dtype", None), getattr(factory, "quantization", None))
    started = time.perf_counter()
    levels, cpu = [], {}
    async with planned.runtime() as runtime:
        up_s = time.perf_counter() - started
        pids = {name: child.proc.pid for name, child in runtime.children.items()}

        def cpu_now() -> dict[str, float]:
            return {name: process_status(pid)["cpu_s"] for name, pid in pids.items()}

        warm = await speak(runtime, client_request(requests[0], args.tokens, args.greedy), False)
        warmed, first = 1, None
        for count in args.levels:
            if args.warm_each_level and count > 1:  # untimed, the same width
                async with anyio.create_task_group() as tg:
                    for i in range(count):
                        data = client_request(requests[i], args.tokens, args.greedy)
                        tg.start_soon(speak, runtime, data, False)
                warmed += count
            answers: list[Answer | None] = [None] * count

            async def one(i: int, answers: list[Answer | None], keep: bool) -> None:
                data = client_request(requests[i], args.tokens, args.greedy)
                answers[i] = await speak(runtime, data, keep)

            before, began = cpu_now(), time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(count):
                    tg.start_soon(one, i, answers, args.greedy and count == 1)
            after = cpu_now()
            done = [a for a in answers if a is not None]
            levels.append(Level(count, done, max(a.done or 0.0 for a in done) - began))
            cpu[count] = {name: after[name] - before[name] for name in pids}
            if count == 1:
                first = done[0]
        memory = {name: process_status(pid) for name, pid in pids.items()}
        engine = {name: engine_lines(whole_log(child)) for name, child in runtime.children.items()}
    return {
        "up_s": up_s,
        "warmup_s": warm.wall_s,
        "warmed": warmed,
        "levels": levels,
        "cpu": cpu,
        "first": first,
        "engine": {name: lines for name, lines in engine.items() if lines},
        "memory": memory,
        "resolved": resolved,
    }


# -- report -------------------------------------------------------------------------


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def rel_l2(ours: np.ndarray, ref: np.ndarray) -> float:
    if ours.shape != ref.shape:
        return float("nan")
    ours, ref = ours.astype(np.float64), ref.astype(np.float64)
    return float(np.linalg.norm(ours - ref) / max(np.linalg.norm(ref), 1e-30))


def resolved_line(ours: dict[str, Any]) -> str:
    """Each model stage's resolved ``factory.dtype`` and ``factory.quantization``."""
    said = []
    for name, (dtype, quantization) in ours["resolved"].items():
        quantized = f" {quantization}" if quantization not in (None, "none") else ""
        said.append(f"{name} {dtype}{quantized}")
    return "our stages as planned: " + ", ".join(said)


def report_ours(args: argparse.Namespace, ours: dict[str, Any]) -> None:
    """Our figures alone (``--smoke``: no reference to compare with)."""
    print(
        f"ours alone: {len(ours['memory'])} processes up in {ours['up_s']:.1f} s "
        f"({ours['warmed']} untimed requests in all)"
    )
    print(resolved_line(ours))
    if engine_report(ours):
        print(engine_report(ours))
    print(f"{'c':>3} {'first audio s':>13} {'RTF':>6} {'audio s/s':>9} {'frames':>7}")
    for level in ours["levels"]:
        ttfa = statistics.mean(a.ttfa_s for a in level.answers)
        rtf = statistics.mean(a.wall_s / a.audio_s for a in level.answers)
        frames = sorted({a.frames for a in level.answers})
        print(
            f"{level.concurrency:>3} {ttfa:>13.2f} {rtf:>6.2f} {level.throughput():>9.3f} "
            f"{frames!s:>7}"
        )


def report(args: argparse.Namespace, reference: dict[str, Any], ours: dict[str, Any]) -> None:
    runs = reference["runs"]
    ref_total = statistics.mean(r["total_s"] for r in runs)
    ref_audio = statistics.mean(r["samples"] for r in runs) / SAMPLE_RATE
    ref_rate = ref_audio / ref_total
    phases = {k: statistics.mean(r["phases"][k] for r in runs) for k in runs[0]["phases"]}
    print(
        f"\nreference, per request (mean of {len(runs)}): {ref_total:.2f} s for "
        f"{ref_audio:.2f} s of audio: thinker {phases['thinker']:.2f} s, talker "
        f"{phases['talker']:.2f} s, code2wav {phases['code2wav']:.2f} s"
    )
    memory = ours["memory"]
    held = sum(m["RssAnon"] for m in memory.values())
    peaks = sum(m["VmHWM"] for m in memory.values())
    print(
        f"ours: {len(memory)} processes up in {ours['up_s']:.1f} s; warm-up request "
        f"{ours['warmup_s']:.2f} s ({ours['warmed']} untimed requests in all); memory held "
        f"at the end {gib(held)} in all (sum of peaks, "
        f"counting the checkpoint pages each mapped while loading: {gib(peaks)})"
    )
    print(resolved_line(ours))
    if engine_report(ours):
        print(engine_report(ours))
    print(
        "\ntime to first audio (s, mean / max over the level's requests), real-time factor "
        "(wall / audio s, mean), throughput (audio s per wall s):"
    )
    head = (
        f"{'c':>3} | {'ref first':>9} {'ref RTF':>7} {'ref tput':>8} | {'ours first':>10} "
        f"{'(max)':>6} {'ours RTF':>8} {'ours tput':>9} | {'first x':>7} {'tput x':>6}"
    )
    print(head)
    print("-" * len(head))
    for level in ours["levels"]:
        c = level.concurrency
        ref_first = (c + 1) / 2 * ref_total  # served one after another
        ref_rtf = statistics.mean((k + 1) * ref_total for k in range(c)) / ref_audio
        ttfa = [a.ttfa_s for a in level.answers]
        rtf = statistics.mean(a.wall_s / a.audio_s for a in level.answers)
        print(
            f"{c:>3} | {ref_first:>9.2f} {ref_rtf:>7.2f} {ref_rate:>8.3f} | "
            f"{statistics.mean(ttfa):>10.2f} {max(ttfa):>6.2f} {rtf:>8.2f} "
            f"{level.throughput():>9.3f} | {ref_first / statistics.mean(ttfa):>6.1f}x "
            f"{level.throughput() / ref_rate:>5.2f}x"
        )
    print(
        "  (ref first / RTF at c > 1: requests served one after another, each taking the "
        "measured mean; its first audio is its whole answer)"
    )

    names = list(memory)
    print("\nours, CPU seconds per wall second of each process during each level (1.0: a core):")
    print(f"{'c':>3} " + " ".join(f"{n[:11]:>11}" for n in names) + f" {'all':>6}")
    for level in ours["levels"]:
        used = ours["cpu"][level.concurrency]
        print(
            f"{level.concurrency:>3} "
            + " ".join(f"{used[n] / level.wall_s:>11.2f}" for n in names)
            + f" {sum(used.values()) / level.wall_s:>6.2f}"
        )
    print(
        "memory held (anonymous resident, GiB): "
        + ", ".join(f"{n} {memory[n]['RssAnon'] / 2**30:.2f}" for n in names)
    )

    print("\nsanity:")
    expected = args.frames * SAMPLES_PER_FRAME - LOOKAHEAD
    ref_ok = all(r["frames"] == args.frames and r["samples"] == expected for r in runs)
    answers = [a for level in ours["levels"] for a in level.answers]
    ours_ok = all(a.frames == args.frames and a.samples == expected for a in answers)
    tokens_ok = all(a.completion_tokens == args.tokens for a in answers)
    print(
        f"  frames per answer {args.frames}, {expected} samples: reference "
        f"{'yes' if ref_ok else 'NO'}, ours {'yes' if ours_ok else 'NO'}; ours "
        f"{args.tokens} answer tokens each: {'yes' if tokens_ok else 'NO'}"
    )
    prompts = [r["prompt_tokens"] for r in runs]
    mine = [a.prompt_tokens for a in ours["levels"][-1].answers[: len(prompts)]]
    print(f"  prompt tokens, reference {prompts}, ours {mine}")
    chunks = statistics.mean(a.chunks for a in answers)
    print(f"  our audio came in {chunks:.1f} chunks per answer on average")
    if args.greedy and reference.get("wavs") and ours["first"] is not None:
        error = rel_l2(ours["first"].wav, reference["wavs"][0])
        print(f"  greedy: request 0's waveform, ours vs reference, rel L2 {error:.2e}")

    by = {level.concurrency: level for level in ours["levels"]}
    if 1 in by and 8 in by:
        first = by[1].answers[0].ttfa_s
        quarter = ref_total / 4
        ratio = by[8].throughput() / ref_rate
        print(
            f"\ntargets: first audio at 1 under a quarter of the reference's total "
            f"({quarter:.2f} s): {first:.2f} s ({'met' if first < quarter else 'NOT met'}); "
            f"throughput at 8 >= 3x the reference's: {ratio:.2f}x "
            f"({'met' if ratio >= 3 else 'NOT met'})"
        )


def smoke(args: argparse.Namespace) -> int:
    """``--smoke``: the same driving and reporting code on the demo deployment, ours alone."""
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    demo = HERE.parent / "examples" / "qwen3_omni_demo.toml"
    requests = make_requests(max(args.levels), args.seed)
    # One process for every stage: the same stages' code, started once instead of seven times.
    flags = ["--talker_ar.factory.max_frames", str(args.frames), *precision_flags(args)]
    for stage in ("preprocessing", "decode", *LOADED):
        flags += [f"--{stage}.process", "smoke"]
    print(
        f"Qwen3-Omni speaking, {demo.name} (tiny preset, dummy weights, every stage in one "
        f"process), {precision(args)}, --smoke: ours alone"
    )
    with tempfile.TemporaryDirectory(prefix="osb-", dir="/tmp") as base:
        ours = anyio.run(measure_ours, Path(base), args, requests, flags, demo)
    report_ours(args, ours)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="thinker layers (release: 48)")
    parser.add_argument("--vision-depth", type=int, default=2, help="ViT blocks (release: 27)")
    parser.add_argument("--talker-layers", type=int, default=2, help="talker layers (release: 20)")
    parser.add_argument(
        "--code2wav-layers", type=int, default=2, help="code2wav transformer layers (release: 8)"
    )
    parser.add_argument("--tokens", type=int, default=16, help="answer tokens per request")
    parser.add_argument("--frames", type=int, default=32, help="frames per answer (80 ms each)")
    parser.add_argument("--levels", default="1,4,8", help="concurrency levels")
    parser.add_argument(
        "--reference-requests", type=int, default=2, help="timed reference requests"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="our model stages' factory.dtype",
    )
    parser.add_argument(
        "--code2wav-dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="the code2wav stage's factory.dtype (default: --dtype, as the release casts "
        "code2wav with the rest)",
    )
    parser.add_argument(
        "--quantization",
        # omni_core.engine.quantize.QUANTIZATIONS, not imported: this script's process
        # drives servers and never imports torch
        choices=("none", "int8", "w8a8_int8"),
        default="none",
        help="the thinker's and talker's factory.quantization (int8 needs --dtype bfloat16; "
        "w8a8_int8: int8 activations too, float32 or bfloat16)",
    )
    parser.add_argument(
        "--fp16-row-weights",
        action="store_true",
        help="the thinker's and talker's factory.fp16_row_weights: float16 copies of their "
        "blocked bf16 weights for one- and two-row products (needs --dtype bfloat16)",
    )
    parser.add_argument(
        "--reference-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the dtype the reference computes in (the whole model cast after loading)",
    )
    parser.add_argument("--greedy", action="store_true", help="greedy, and compare waveforms")
    parser.add_argument(
        "--warm-each-level",
        action="store_true",
        help="before each level above 1, one untimed pass of the same width (on a GPU a "
        "batch size's first steps choose kernels and capture graphs; gpu_check.py sets it)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the checkpoint goes (default: /tmp)"
    )
    parser.add_argument(
        "--reference-python",
        type=Path,
        default=Path(os.environ.get("QWEN_TTS_REF_PYTHON", "/tmp/qwen-tts-ref/bin/python")),
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="ours alone on the demo deployment (tiny preset), 4 tokens and 4 frames at "
        "concurrency 1 and 2: checks the script runs (make test)",
    )
    args = parser.parse_args()
    if args.quantization == "int8" and args.dtype != "bfloat16":
        parser.error("--quantization int8 computes in bf16: add --dtype bfloat16")
    if args.fp16_row_weights and (args.dtype != "bfloat16" or args.quantization != "none"):
        parser.error("--fp16-row-weights copies bf16 weights: add --dtype bfloat16, without int8")
    args.code2wav_dtype = args.code2wav_dtype or args.dtype
    if args.smoke:
        args.levels, args.tokens, args.frames = "1,2", 4, 4
    args.levels = [int(c) for c in args.levels.split(",")]
    if args.smoke:
        return smoke(args)
    if not args.reference_python.exists():
        print(
            f"skipped: no reference environment at {args.reference_python} (set "
            "QWEN_TTS_REF_PYTHON or --reference-python; see plugins/qwen3_tts/tests/REFERENCE.md)"
        )
        return 0
    # The runtime's children inherit this (it sets no thread count of its own).
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    started = time.perf_counter()
    requests = make_requests(max(max(args.levels), args.reference_requests), args.seed)
    print(
        f"Qwen3-Omni speaking at the release's widths: thinker {args.layers} of 48 layers "
        f"(vision {args.vision_depth} of 27 blocks, audio 2 of 32), talker {args.talker_layers} "
        f"of 20 (code predictor 5 of 5), code2wav transformer {args.code2wav_layers} of 8 "
        f"(decoder whole); ours {precision(args)}, the reference {args.reference_dtype}, "
        f"on cpu, {args.threads} torch thread(s) per process; "
        f"{args.tokens} answer tokens and {args.frames} frames "
        f"({(args.frames * SAMPLES_PER_FRAME - LOOKAHEAD) / SAMPLE_RATE:.2f} s) per request; "
        f"sampling: {'greedy' if args.greedy else 'the release defaults'}"
    )
    print(
        "weights: seeded by parameter name in the reference runner, written once as a "
        "safetensors checkpoint; our stages load it (load_format safetensors)"
    )
    workdir = Path(tempfile.mkdtemp(prefix="omni-speech-bench-", dir=args.workdir))
    try:
        ckpt = workdir / "ckpt"
        job = {
            "config": root_config(args),
            "seed": args.seed,
            "threads": args.threads,
            "dtype": args.reference_dtype,
            "checkpoint": str(ckpt),
            "sampling": "greedy" if args.greedy else "release",
            "requests": requests,
            "reference_requests": args.reference_requests,
            "tokens": args.tokens,
            "frames": args.frames,
        }
        reference = run_reference(args.reference_python, job, workdir)
        size = sum(f.stat().st_size for f in ckpt.iterdir())
        parts = ", ".join(f"{k} {v / 1e9:.2f} B" for k, v in reference["parts"].items())
        print(
            f"reference: {reference['parameters'] / 1e9:.2f} B parameters ({parts}) built in "
            f"{reference['build_s']:.0f} s, checkpoint written in {reference['write_s']:.0f} s "
            f"({size / 1e9:.1f} GB); ran in {reference['dtype']}, {reference['wall_s']:.0f} s in "
            "all, "
            f"{reference['threads']} thread(s), peak memory {gib(reference['peak_rss_bytes'])}"
        )
        with tempfile.TemporaryDirectory(prefix="osb-", dir="/tmp") as base:
            flags = checkpoint_flags(ckpt, args)
            ours = anyio.run(measure_ours, Path(base), args, requests, flags)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(args, reference, ours)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    run_script(main)
