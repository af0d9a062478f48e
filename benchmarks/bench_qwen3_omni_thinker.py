"""Qwen3-Omni's thinker at its real width (dummy weights) on this machine: ours vs the reference.

Run: ``python benchmarks/bench_qwen3_omni_thinker.py [--layers 2] [--threads 1] [--full]``
(about 4 minutes on two CPU cores; each side peaks at about 9 GiB at the default
two layers, and they run one after the other). Without the reference
environment it prints ``skipped`` and exits 0.

What runs: the thinker's decoder at the release's width (hidden 2048, 32
query / 4 KV heads of head_dim 128, 128 experts top-8 of moe_intermediate
768, vocabulary 152064, interleaved M-RoPE [24, 20, 20]) but only
``--layers`` decoder layers (the release has 48: each sparse layer is 2.4 GB
in float32, the embedding and the LM head 1.25 GB each), and a vision tower
at the release's width (hidden 1152, 16 heads, MLP 4304, patch 16, merge 2,
output 2048) with ``--vision-depth`` blocks (the release has 27) and one
deepstack feature per block (at most ``--layers`` of them; the release has 3).
Float32 on the CPU by default, the same ``--threads`` torch threads on both
sides; ``--dtype bfloat16`` casts our weights after filling (as the stage's
loader builds them for ``factory.dtype``: parameters only, the rotary tables
stay float32; oneDNN packing is float32's, so one layout is measured),
``--quantization int8`` then swaps in int8 weight-only layers as the stage
does for ``factory.quantization`` (experts included, the LM head not;
``w8a8_int8``: int8 activations too, float32 or bf16),
``--fp16-row-weights`` gives the blocked bf16 weights float16 copies for one-
and two-row products as the stage does for ``factory.fp16_row_weights``, and
``--reference-dtype bfloat16`` casts the reference's parameters the same way.

* the reference, first, in its own environment (``--reference-python``,
  default ``/tmp/qwen-tts-ref/bin/python``, transformers 4.57.3; see
  ``qwen3_omni_thinker_reference_runner.py``): transformers'
  ``Qwen3OmniMoeThinkerForConditionalGeneration`` (sdpa) and its ``generate``;
* then ours, in this process: ``ThinkerLM`` + ``ThinkerStepModel`` over the
  ``TorchEngine`` (what the thinker stage runs), requests submitted
  concurrently and streamed, and the ``VisionEncoder`` for the image. Ours is
  measured once per ``--ours`` layout, default twice: with dense weights
  (MKL), then ``mixed``, as the thinker stage runs on the CPU
  (``factory.pack_weights``, the default): every large linear weight but the
  experts' repacked for oneDNN (an expert sees a row or two per step, where
  MKL is faster); ``packed`` repacks the experts too. The two processes
  never hold a model at the same time.

Same weights: both sides fill every parameter with the runner's
``fill_parameter`` (a generator seeded by the parameter's name), so nothing
is written to disk; the reference reports every name, shape and sum, and we
check that ours has exactly those names and shapes (what a strict
``load_state_dict`` of the reference's ``thinker.`` tensors would check) and
the same sums.

Figures:

* decode tokens/s at each concurrency ``c``: ``c`` prompts of ``--prompt``
  random text tokens (equal lengths, so the reference's batch needs no
  padding), greedy, exactly ``--new-tokens`` tokens each (EOS off on both
  sides). Decode time runs from the moment every request has its first token
  (the end of the prefill) to the last token; tokens counted are those after
  each request's first, ``c * (new_tokens - 1)``. The reference is one
  ``generate`` call with the ``c`` prompts as a batch, stamped by a streamer
  at every step; ours stamps each token as its request's stream yields it.
  Also per decode step: milliseconds inside attention, inside the sparse-MoE
  blocks and inside the LM head (module hooks), the rest being everything
  else (embedding, norms, sampling, scheduling), and a projection to the
  release's 48 layers (step time with the attention + MoE share scaled by
  ``48 / layers``): with few layers the LM head (1.25 GB read per step)
  weighs far more than in the real model;
* time to first token with one image (``--image``-pixel square; 448: 196
  image tokens, 222 prompt tokens): from pixel values in hand
  (preprocessing excluded on both sides: the same ``image_to_patches`` rows
  go to both) to the first generated token. Ours: the vision tower, prompt
  positions and assembly, the engine's prefill; the reference:
  ``generate(max_new_tokens=1)`` with ``pixel_values``. Best of ``--repeats``
  after a warm-up;
* sanity: greedy tokens of ours vs the reference (same weights, same
  prompts; they agree unless rounding flips a near-tie), and the first token
  after the image prompt;
* peak resident memory of each process;
* our decode step at concurrency 1 against the memory-bandwidth limit
  (``roofline.py``): the bytes of weights one step reads, counted op by op in
  a warm-up step (attention, the routed experts, the LM head, one embedding
  row) in the dtype used, plus the KV cache at the mean cached length, over
  the limit measured with the same threads at the start and the end (the
  higher kept), as a percentage of the measured step (mean and median), and
  of the sustained rate (the median pass) beside it; and the counted step's
  weight-reading ops run again alone (``roofline.kernel_seconds``): their
  time against the limit, and the rest of the step.

Threads: default 1. On this two-core machine, whenever another process
holds a core, an OpenMP-parallel op at 2 threads waits for it: ``index_add_``
on a few rows, which both MoE implementations call once per touched expert,
then takes 17-28 ms instead of 0.01-0.03 ms (torch 2.13), which swamps both
sides; on a quiet machine 2 threads are fine (``--threads 2``).

Noise: the two sides cannot run at the same time, so anything else running
on the machine shifts one side's figures and not the other's; runs on a
loaded two-core machine moved single ratios by up to +-30 %, and its memory
bandwidth moved between 35 and 66 GB/s within one run. So the sides
alternate for ``--rounds`` rounds (default 2: the reference, ours, the
reference, ours; after the first round only the last of ``--ours``), each
round's tokens/s are printed, and the report keeps each side's fastest run
per level. The per-step median is printed next to the mean as a check.

``--smoke``: a tiny thinker (width 64, 4 experts) and vision tower, 4 new
tokens at concurrency 1 and 2, a 64-pixel image, ours alone (no reference), in
seconds: it checks that the script still runs (``make test``).

``--profile`` adds a torch.profiler table of one of our decode steps at the
highest concurrency (packed weights), from an extra run outside the figures.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import random
import resource
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np
import roofline  # its kernel_seconds and kernels_line: a step's kernels alone
import torch
from roofline import Bandwidth, StepReads, best, kv_bytes, limit_line, read_bandwidth

from omni_core.engine.backends import create_engine
from omni_core.engine.compute import dedicate
from omni_core.engine.cpu_linear import pack_linear_weights, packing_available
from omni_core.engine.cpu_row_copy import apply_row_copies
from omni_core.engine.huge_pages import ask_for_huge_pages, user_environ
from omni_core.engine.interface import EngineSettings, SamplingParams
from omni_core.engine.precision import PrecisionError, torch_dtype
from omni_core.engine.prompt import EmbeddedPrompt
from omni_core.engine.quantize import QUANTIZATIONS, apply_quantization, quantization_problem
from omni_core.sigterm import run_script
from omni_qwen3_omni.assemble import assemble, to_prompt
from omni_qwen3_omni.config import ThinkerConfig
from omni_qwen3_omni.loading import construct
from omni_qwen3_omni.thinker.cpu_weights import pack_decoder_weights
from omni_qwen3_omni.thinker.decoder import ThinkerLM
from omni_qwen3_omni.thinker.positions import MediaTokens, prompt_positions
from omni_qwen3_omni.thinker.step import ThinkerStepModel
from omni_qwen3_omni.vision.encoder import VisionEncoder
from omni_qwen3_omni.vision.processor import image_to_patches

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "qwen3_omni_thinker_reference_runner.py"
RELEASE_LAYERS = 48
VARIANTS = ("dense", "mixed", "packed")
# The release's special ids (Qwen3-Omni-30B-A3B-Instruct's config.json and tokenizer).
IDS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "audio_token_id": 151675,
    "audio_start_token_id": 151669,
    "vision_start_token_id": 151652,
    "position_id_per_seconds": 13,
    "user_token_id": 872,
}
VISION_END, IM_START, IM_END, NEWLINE, ASSISTANT = 151653, 151644, 151645, 198, 77091
PLAIN_VOCAB = 151643  # ids below this are ordinary text tokens


def load_runner() -> ModuleType:
    """The reference runner as a module (its ``fill_parameter`` and ``Timers``; no transformers)."""
    spec = importlib.util.spec_from_file_location("thinker_reference_runner", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runner = load_runner()


# -- sizes and inputs ---------------------------------------------------------------


def sections(layers: int, vision_depth: int, tiny: bool = False) -> dict[str, Any]:
    """``text_config`` / ``vision_config`` at the release's widths, fewer layers and blocks.

    ``tiny`` (``--smoke``): every width small (the vocabulary stays, as the
    release's special ids index it), so that the script runs in seconds.
    """
    if tiny:
        return tiny_sections(layers, vision_depth)
    deepstack = min(3, layers, vision_depth)
    text = {
        "vocab_size": 152064,
        "hidden_size": 2048,
        "intermediate_size": 768,
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_scaling": {
            "rope_type": "default",
            "mrope_section": [24, 20, 20],
            "interleaved": True,
        },
        "attention_bias": False,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "mlp_only_layers": [],
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": vision_depth,
        "hidden_size": 1152,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 4304,
        "num_heads": 16,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 2048,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": list(range(vision_depth - deepstack, vision_depth)),
    }
    return {"text": text, "vision": vision}


def tiny_sections(layers: int, vision_depth: int) -> dict[str, Any]:
    """The release's shapes shrunk: width 64 (4/2 heads of 16), 4 experts top-2, ViT width 32."""
    parts = sections(layers, vision_depth)
    parts["text"].update(
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        rope_scaling={"rope_type": "default", "mrope_section": [4, 2, 2], "interleaved": True},
    )
    parts["vision"].update(hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    return parts


@dataclass
class Inputs:
    prompts: list[list[int]]
    warmup: list[int]
    image_ids: list[int]
    pixel_values: torch.Tensor
    grid: tuple[int, int, int]


def make_inputs(levels: list[int], prompt: int, image: int, seed: int) -> Inputs:
    rng = random.Random(seed)

    def text(n: int) -> list[int]:
        return [rng.randrange(PLAIN_VOCAB) for _ in range(n)]

    prompts = [text(prompt) for _ in range(max(levels))]
    # A smooth picture with some noise, RGB uint8; what it shows does not matter.
    gen = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:image, 0:image] / image
    base = np.stack([yy, xx, (yy + xx) / 2], axis=-1) * 200
    pixels = np.clip(base + gen.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    pixel_values, grid = image_to_patches(pixels)
    count = grid[0] * grid[1] * grid[2] // 4
    image_ids = (
        [IM_START, IDS["user_token_id"], NEWLINE, IDS["vision_start_token_id"]]
        + [IDS["image_token_id"]] * count
        + [VISION_END, *text(16), IM_END, NEWLINE, IM_START, ASSISTANT, NEWLINE]
    )
    return Inputs(prompts, text(8), image_ids, pixel_values, tuple(grid))


# -- the reference ------------------------------------------------------------------


def run_reference(
    python: Path, job: dict[str, Any], inputs: Inputs, workdir: Path
) -> dict[str, Any]:
    from safetensors.torch import save_file

    save_file({"pixel_values": inputs.pixel_values.contiguous()}, str(workdir / "pixels.st"))
    job = {
        **job,
        "prompts": inputs.prompts,
        "warmup_prompt": inputs.warmup,
        "image": {
            "pixel_values": str(workdir / "pixels.st"),
            "grid_thw": list(inputs.grid),
            "token_ids": inputs.image_ids,
        },
    }
    (workdir / "job.json").write_text(json.dumps(job))
    started = time.perf_counter()
    done = subprocess.run(
        [str(python), str(RUNNER), str(workdir / "job.json"), str(workdir / "out.json")],
        capture_output=True,
        text=True,
        check=False,
        env={
            **user_environ(),
            "PYTHONWARNINGS": "ignore",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": str(job["threads"]),
        },
    )
    if done.returncode != 0:
        raise RuntimeError(f"the reference runner failed:\n{done.stderr[-4000:]}")
    result = json.loads((workdir / "out.json").read_text())
    result["wall_s"] = time.perf_counter() - started
    return result


# -- ours ---------------------------------------------------------------------------


@dataclass
class Level:
    concurrency: int
    tokens: list[list[int]]
    stamps: list[float]  # when each step's tokens were out (the first: every request's first)
    inside: dict[str, float]  # seconds inside attention / moe / head during decode steps

    def decode_tokens(self) -> int:
        return sum(len(t) - 1 for t in self.tokens)

    def tokens_per_s(self) -> float:
        return self.decode_tokens() / (self.stamps[-1] - self.stamps[0])

    def step_s(self) -> float:
        return (self.stamps[-1] - self.stamps[0]) / (len(self.stamps) - 1)

    def median_step_s(self) -> float:
        """Less sensitive than the mean to another process taking the core for a while."""
        return statistics.median(b - a for a, b in pairwise(self.stamps))


@dataclass
class Ours:
    label: str
    levels: list[Level] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    ttft_vision_s: list[float] = field(default_factory=list)
    image_first_token: int | None = None
    threads_in_engine: int | None = None
    profile: str | None = None
    step_bytes: int = 0  # weights one decode step at concurrency 1 reads (StepReads)
    kernels_s: float = 0.0  # that step's weight-reading ops alone (roofline.kernel_seconds)
    kernel_ops: int = 0  # how many ops those are
    dtype: torch.dtype = torch.float32  # the weights' (and the KV cache's)
    compile_s: float | None = None  # engine.enable_torch_compile: the buckets' warm-up


class TimedStep(ThinkerStepModel):
    """The stage's step model, with module timers counting during decode steps only."""

    def __init__(self, *args: Any, timers: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.timers = timers
        self.threads: int | None = None
        self.profile_steps: list[int] = []  # decode calls to profile (counted from 0)
        self.decode_calls = 0
        self.profiles: list[Any] = []
        self.reads: StepReads | None = None  # set: count the next decode step's weight bytes
        self.read_bytes = 0
        self.read_ops: list[Any] = []  # the counted step's weight-reading ops (record=True)

    def decode(self, sequences: list[Any], cache: Any) -> Any:
        self.threads = torch.get_num_threads()  # in the engine's worker thread
        self.timers.active = True
        try:
            if self.reads is not None:  # outside the timed levels (the warm-up)
                reads, self.reads = self.reads, None
                with reads:
                    out = super().decode(sequences, cache)
                self.read_bytes, self.read_ops = reads.bytes, reads.ops
                return out
            if self.decode_calls in self.profile_steps:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                    out = super().decode(sequences, cache)
                self.profiles.append(p)
                return out
            return super().decode(sequences, cache)
        finally:
            self.timers.active = False
            self.decode_calls += 1


def build_ours(cfg: ThinkerConfig, seed: int) -> tuple[ThinkerLM, VisionEncoder]:
    """Both modules in float32, filled as the reference fills its own (cast later: ``cast``)."""
    cpu = torch.device("cpu")
    lm = construct(lambda: ThinkerLM(cfg.text), cpu, torch.float32)
    for name, param in lm.named_parameters():
        runner.fill_parameter(name, param.data, seed)
    vision = construct(lambda: VisionEncoder(cfg.vision), cpu, torch.float32)
    for name, param in vision.named_parameters():
        runner.fill_parameter("visual." + name, param.data, seed)
    return lm, vision


def cast(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters to ``dtype``, buffers (rotary tables) kept, as the stages' loader builds them."""
    for param in module.parameters():
        param.data = param.data.to(dtype)


def check_same_weights(
    lm: ThinkerLM, vision: VisionEncoder, manifest: dict[str, list[Any]]
) -> list[str]:
    """Problems (empty: none) between our parameters and the reference's names, shapes, sums."""
    ours = dict(lm.state_dict())
    ours.update({"visual." + name: p for name, p in vision.state_dict().items()})
    problems = []
    missing = sorted(set(manifest) - set(ours))
    extra = sorted(set(ours) - set(manifest))
    if missing:
        problems.append(f"reference tensors we lack: {missing[:5]} ({len(missing)})")
    if extra:
        problems.append(f"our tensors the reference lacks: {extra[:5]} ({len(extra)})")
    for name in sorted(set(manifest) & set(ours)):
        shape, total = manifest[name]
        if list(ours[name].shape) != shape:
            problems.append(f"{name}: reference {shape}, ours {list(ours[name].shape)}")
            continue
        mine = runner.checksum(ours[name])
        if abs(mine - total) > 1e-6 * max(1.0, abs(total)):
            problems.append(f"{name}: different values (sums: reference {total}, ours {mine})")
    return problems


async def run_level(engine: Any, prompts: list[list[int]], new_tokens: int, tag: str) -> Level:
    count = len(prompts)
    tokens: list[list[int]] = [[] for _ in prompts]
    stamps: list[list[float]] = [[] for _ in prompts]
    sampling = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    streams = [
        engine.enqueue(f"{tag}-{count}-{i}", EmbeddedPrompt(token_ids=list(p)), sampling)
        for i, p in enumerate(prompts)
    ]

    async def consume(i: int) -> None:
        async with streams[i] as stream:
            async for token in stream:
                tokens[i].append(int(token))
                stamps[i].append(time.perf_counter())

    async with anyio.create_task_group() as group:
        for i in range(count):
            group.start_soon(consume, i)
    assert all(len(t) == new_tokens for t in tokens), [len(t) for t in tokens]
    # Every step yields one token to each running request: the latest stamp of
    # step k over the requests is when step k's tokens were all out.
    steps = [max(s[k] for s in stamps) for k in range(new_tokens)]
    return Level(count, tokens, steps, inside={})


async def image_ttft(
    engine: Any, vision: VisionEncoder, cfg: ThinkerConfig, inputs: Inputs, tag: str
) -> tuple[float, float, int]:
    """Seconds from pixel values to the first token; of which the vision tower; the token."""
    started = time.perf_counter()

    def encode() -> tuple[torch.Tensor, list[torch.Tensor]]:  # the image_encoder stage's work
        pixels = inputs.pixel_values.to(next(vision.parameters()).dtype)  # as the stage does
        with torch.inference_mode():
            return vision(pixels, torch.tensor([inputs.grid]))

    embeds, deepstack = await anyio.to_thread.run_sync(encode)
    encoded = time.perf_counter()
    where = prompt_positions(
        inputs.image_ids, MediaTokens.from_config(cfg), image_grids=[inputs.grid]
    )
    pre = {
        "prompt": {
            "token_ids": inputs.image_ids,
            "positions": where.positions,
            "next_position": where.next_position,
        }
    }
    prompt = to_prompt(
        assemble(pre, {"image_encoder": {"embeds": embeds, "deepstack": deepstack}}, cfg)
    )
    sampling = SamplingParams(temperature=0.0, max_new_tokens=1)
    async with engine.enqueue(f"{tag}-image", prompt, sampling) as stream:
        async for token in stream:
            return time.perf_counter() - started, encoded - started, int(token)
    raise RuntimeError("the image request produced no token")


async def measure_ours(
    label: str,
    lm: ThinkerLM,
    vision: VisionEncoder,
    cfg: ThinkerConfig,
    inputs: Inputs,
    levels: list[int],
    new_tokens: int,
    repeats: int,
    profile: bool,
    compiled: bool = False,
) -> Ours:
    timers = runner.Timers()
    timers.active = False
    if not compiled:  # module hooks cannot run inside a compiled graph
        for layer in lm.model.layers:
            timers.attach(layer.self_attn, "attention")
            timers.attach(layer.mlp, "moe")
        timers.attach(lm.lm_head, "head")
    step = TimedStep(
        lm,
        cfg.text,
        eos_ids=set(),  # exactly new_tokens per request, as the reference (EOS off)
        device=torch.device("cpu"),
        dtype=lm.model.embed_tokens.weight.dtype,
        timers=timers,
    )
    longest = max(len(inputs.image_ids), *(len(p) for p in inputs.prompts)) + new_tokens
    settings = EngineSettings(
        max_running_requests=max(levels),
        max_total_tokens=max(levels) * (longest + 16),
        enable_torch_compile=compiled,
    )
    engine = create_engine(step, settings, device="cpu")  # compiles every bucket first
    result = Ours(label, compile_s=engine.warm_up_seconds)
    try:
        if not compiled:  # the eager run counts what a step reads
            step.reads = StepReads(lm, record=True)  # the warm-up's first decode step (c=1)
        await run_level(engine, [inputs.warmup], 3, f"{label}-warmup")
        result.step_bytes = step.read_bytes
        if step.read_ops:  # the counted step's weight-reading ops, run again alone
            result.kernel_ops = len(step.read_ops)
            result.kernels_s = roofline.kernel_seconds(step.read_ops)
            step.read_ops = []  # they hold the weights
        for count in levels:
            timers.reset()
            level = await run_level(engine, inputs.prompts[:count], new_tokens, label)
            level.inside = dict(timers.seconds)
            result.levels.append(level)
        if profile:  # an extra, untimed run: the profiler's overhead stays out of the figures
            step.profile_steps = [step.decode_calls + 3]
            await run_level(engine, inputs.prompts[: max(levels)], 6, f"{label}-profile")
            result.profile = profile_table(step.profiles)
        for attempt in range(1 + repeats):
            seconds, vision_s, token = await image_ttft(
                engine, vision, cfg, inputs, f"{label}-{attempt}"
            )
            if attempt:  # the first call warms up
                result.ttft_s.append(seconds)
                result.ttft_vision_s.append(vision_s)
            result.image_first_token = token
    finally:
        await engine.aclose()
        timers.detach()
    result.threads_in_engine = step.threads
    result.dtype = lm.model.embed_tokens.weight.dtype
    return result


def measure(label: str, common: tuple[Any, ...], profile: bool, compiled: bool = False) -> Ours:
    """:func:`measure_ours` run to completion; ``common``: its arguments after the label."""
    return anyio.run(functools.partial(measure_ours, compiled=compiled), label, *common, profile)


def profile_table(profiles: list[Any], rows: int = 18) -> str:
    events = profiles[-1].key_averages()
    return events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=40)


# -- report -------------------------------------------------------------------------


def reference_levels(reference: dict[str, Any]) -> list[Level]:
    return [
        Level(r["concurrency"], r["tokens"], r["stamps"], r["inside"]) for r in reference["levels"]
    ]


def projected(level: Level, layers: int) -> float:
    """Decode tokens/s with ``RELEASE_LAYERS`` layers: attention + MoE time scaled up."""
    steps = len(level.stamps) - 1
    per_layer = (level.inside.get("attention", 0.0) + level.inside.get("moe", 0.0)) / steps
    step = level.step_s() + per_layer * (RELEASE_LAYERS / layers - 1)
    return level.concurrency / step


def projected_compiled(level: Level, eager: Level, layers: int) -> float:
    """:func:`projected` for a compiled run, whose graph has no module timers: its layers
    take its step less what eager's step spends outside the layers (the embedding, the
    final norm, the LM head, sampling: the same eager kernels compiled or not)."""
    steps = len(eager.stamps) - 1
    eager_layers = (eager.inside.get("attention", 0.0) + eager.inside.get("moe", 0.0)) / steps
    layers_s = max(level.step_s() - (eager.step_s() - eager_layers), 0.0)
    step = level.step_s() + layers_s * (RELEASE_LAYERS / layers - 1)
    return level.concurrency / step


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def report_limit(
    runs: list[Ours], cfg: ThinkerConfig, bandwidth: Bandwidth, prompt: int, new_tokens: int
) -> None:
    """Each of our runs' decode step at concurrency 1 against the memory-bandwidth limit."""
    text = cfg.text
    print(
        "\nour decode step at concurrency 1 vs the memory-bandwidth limit (weights counted op by "
        "op in one step: attention, the routed experts, the LM head, one embedding row; KV at "
        "the mean cached length):"
    )
    for run in runs:
        one = next((lv for lv in run.levels if lv.concurrency == 1), None)
        if one is None or not run.step_bytes:
            print(f"  {run.label}: no concurrency-1 level measured")
            continue
        kv = kv_bytes(
            text.num_hidden_layers,
            text.num_key_value_heads,
            text.head_dim,
            prompt + (new_tokens - 1) / 2,
            run.dtype,
        )
        print("  " + limit_line(run.label, run.step_bytes, kv, one.step_s(), bandwidth))
        floor_s = (run.step_bytes + kv) / (bandwidth.gb_s * 1e9)
        print(
            f"    (at the median step, {one.median_step_s() * 1e3:.1f} ms: "
            f"{100 * floor_s / one.median_step_s():.0f}%)"
        )
        if run.kernels_s:
            line = roofline.kernels_line(
                run.kernel_ops, run.step_bytes, run.kernels_s, one.step_s(), bandwidth
            )
            print("  " + line)


def report_ours(runs: list[Ours], new_tokens: int, prompt: int) -> None:
    """Our figures alone (``--smoke``: no reference to compare with)."""
    print(f"\nours alone: decode tokens/s ({prompt}-token prompts, {new_tokens} new tokens each)")
    print(f"{'side':>14} {'c':>3} {'tokens/s':>9} {'step ms':>8} {'image ttft s':>13}")
    for run in runs:
        for lv in run.levels:
            print(
                f"{run.label:>14} {lv.concurrency:>3} {lv.tokens_per_s():>9.1f} "
                f"{lv.step_s() * 1e3:>8.1f} {min(run.ttft_s):>13.3f}"
            )


def report_compiled(
    eager: Ours, compiled: Ours, reference: dict[str, Any] | None, layers: int
) -> None:
    """The compiled run's decode tokens/s beside the eager run's, measured and projected to
    the release's layers (:func:`projected_compiled`: no module timers inside a graph)."""
    ref = {lv.concurrency: lv for lv in reference_levels(reference)} if reference else {}
    print(
        f"\ncompiled decode step ({compiled.label}, engine.enable_torch_compile; the buckets "
        f"compiled in {compiled.compile_s or 0.0:.1f} s), tokens/s; projected to "
        f"{RELEASE_LAYERS} layers with eager's time outside the layers:"
    )
    print(
        f"{'concurrency':>11} {'eager':>9} {'compiled':>9} {'/ eager':>8} {'/ reference':>12}"
        f" {'projected':>10} {'/ eager':>8} {'/ reference':>12}"
    )
    for lv in compiled.levels:
        base = next(e for e in eager.levels if e.concurrency == lv.concurrency)
        versus = ref.get(lv.concurrency)
        against = f"{lv.tokens_per_s() / versus.tokens_per_s():.2f}x" if versus else "-"
        ahead = projected_compiled(lv, base, layers)
        ahead_ref = f"{ahead / projected(versus, layers):.2f}x" if versus else "-"
        print(
            f"{lv.concurrency:>11} {base.tokens_per_s():>9.2f} {lv.tokens_per_s():>9.2f} "
            f"{lv.tokens_per_s() / base.tokens_per_s():>7.2f}x {against:>12}"
            f" {ahead:>10.2f} {ahead / projected(base, layers):>7.2f}x {ahead_ref:>12}"
        )


#: Throughput over the reference at concurrency 1 and 8 that the issues ask for: with
#: float32 weights (as the reference's), and with fewer bytes per weight (issue 29:
#: bf16 or int8, against the reference in float32 and, where it runs so, in bf16).
TARGETS = {"float32": (1.0, 3.0), "reduced": (1.5, 2.5)}


def target_line(stage: Ours, r1: float, r8: float, r8_over_reference_1: float) -> str:
    """Our throughput over the reference's at concurrency 1 and 8 against the targets for
    ``stage``'s weights (:data:`TARGETS`)."""
    t1, t8 = TARGETS["float32" if stage.dtype == torch.float32 else "reduced"]
    return (
        f"targets ({stage.label}): >= {t1:g}x the reference at concurrency 1: {r1:.2f}x "
        f"({'met' if r1 >= t1 else 'NOT met'}); >= {t8:g}x at 8: {r8:.2f}x "
        f"({'met' if r8 >= t8 else 'NOT met'}); ours at 8 / reference at 1: "
        f"{r8_over_reference_1:.2f}x"
    )


def report(
    reference: dict[str, Any], runs: list[Ours], layers: int, new_tokens: int, prompt: int
) -> None:
    ref = {lv.concurrency: lv for lv in reference_levels(reference)}

    def table(title: str, figure: Any) -> None:
        print(title)
        print(
            f"{'concurrency':>11} {'reference':>10}"
            + "".join(f" {r.label:>12} {'ratio':>6}" for r in runs)
        )
        for c, base in ref.items():
            line = f"{c:>11} {figure(base):>10.2f}"
            for run in runs:
                ours = next(lv for lv in run.levels if lv.concurrency == c)
                line += f" {figure(ours):>12.2f} {figure(ours) / figure(base):>5.2f}x"
            print(line)

    table(
        f"\ndecode tokens/s ({prompt}-token prompts, {new_tokens} new tokens each, "
        f"{layers} layers):",
        Level.tokens_per_s,
    )
    table(
        f"\nthe same projected to the release's {RELEASE_LAYERS} layers (attention + MoE time "
        f"x {RELEASE_LAYERS}/{layers}):",
        lambda lv: projected(lv, layers),
    )

    print("\nper decode step, milliseconds (mean; median; inside attention / MoE / LM head; rest):")
    print(
        f"{'side':>12} {'c':>3} {'mean':>7} {'median':>7} {'attention':>10} {'moe':>7} "
        f"{'head':>7} {'rest':>6}"
    )
    sides = [("reference", list(ref.values()))] + [(r.label, r.levels) for r in runs]
    for label, levels in sides:
        for lv in levels:
            steps = len(lv.stamps) - 1
            parts = [lv.inside.get(k, 0.0) / steps * 1e3 for k in ("attention", "moe", "head")]
            rest = lv.step_s() * 1e3 - sum(parts)
            print(
                f"{label:>12} {lv.concurrency:>3} {lv.step_s() * 1e3:>7.1f} "
                f"{lv.median_step_s() * 1e3:>7.1f} {parts[0]:>10.1f} {parts[1]:>7.1f} "
                f"{parts[2]:>7.1f} {rest:>6.1f}"
            )

    print("\ntime to first token with one image (pixel values in hand -> first token), s:")
    ref_ttft = min(reference["ttft_s"])
    print(f"{'side':>14} {'best':>7} {'vision':>7} {'ratio (ref / ours)':>19}")
    print(f"{'reference':>14} {ref_ttft:>7.2f} {min(reference['ttft_vision_s']):>7.2f}")
    for run in runs:
        best = min(run.ttft_s)
        print(
            f"{run.label:>14} {best:>7.2f} {min(run.ttft_vision_s):>7.2f} {ref_ttft / best:>18.2f}x"
        )

    print("\nsanity (greedy tokens, same weights and prompts):")
    for run in runs:
        for lv in run.levels:
            base = ref[lv.concurrency]
            equal = sum(a == b for a, b in zip(lv.tokens, base.tokens, strict=True))
            prefixes = [same_prefix(a, b) for a, b in zip(lv.tokens, base.tokens, strict=True)]
            print(
                f"  {run.label}, concurrency {lv.concurrency}: {equal}/{len(lv.tokens)} "
                f"sequences equal to the reference's (common prefix min {min(prefixes)} "
                f"of {new_tokens})"
            )
        same = run.image_first_token == reference["image_first_token"]
        print(
            f"  {run.label}, image prompt: first token {run.image_first_token} vs reference "
            f"{reference['image_first_token']} ({'equal' if same else 'DIFFERENT'})"
        )

    stage = next((r for r in runs if r.label == "ours packed"), runs[-1])
    by = {lv.concurrency: lv for lv in stage.levels}
    if 1 in by and 8 in by and 1 in ref and 8 in ref:
        r1 = by[1].tokens_per_s() / ref[1].tokens_per_s()
        r8 = by[8].tokens_per_s() / ref[8].tokens_per_s()
        print("\n" + target_line(stage, r1, r8, by[8].tokens_per_s() / ref[1].tokens_per_s()))
        p1 = projected(by[1], layers) / projected(ref[1], layers)
        p8 = projected(by[8], layers) / projected(ref[8], layers)
        print(f"  projected to 48 layers: {p1:.2f}x at 1, {p8:.2f}x at 8")
    for run in runs:
        if run.profile:
            print(f"\nprofile of one decode step of ours ({run.label}) at the highest concurrency:")
            print(run.profile)


def fastest_levels(runs: list[list[Level]]) -> list[Level]:
    """Each concurrency's fastest level over ``runs`` (decode tokens/s), in order."""
    best: dict[int, Level] = {}
    for levels in runs:
        for level in levels:
            kept = best.get(level.concurrency)
            if kept is None or level.tokens_per_s() > kept.tokens_per_s():
                best[level.concurrency] = level
    return [best[c] for c in sorted(best)]


def fastest_ours(rounds: list[Ours]) -> Ours:
    """One side's rounds as one run: each level's fastest, every image timing."""
    if len(rounds) == 1:
        return rounds[0]
    return replace(
        rounds[0],
        levels=fastest_levels([r.levels for r in rounds]),
        ttft_s=[t for r in rounds for t in r.ttft_s],
        ttft_vision_s=[t for r in rounds for t in r.ttft_vision_s],
    )


def fastest_reference(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The reference's rounds as one result: each level's fastest, every image timing."""
    if len(rounds) == 1:
        return rounds[0]
    parsed = [reference_levels(result) for result in rounds]
    raw_of = {
        id(level): raw
        for result, levels in zip(rounds, parsed, strict=True)
        for raw, level in zip(result["levels"], levels, strict=True)
    }
    return {
        **rounds[0],
        "levels": [raw_of[id(level)] for level in fastest_levels(parsed)],
        "ttft_s": [t for r in rounds for t in r["ttft_s"]],
        "ttft_vision_s": [t for r in rounds for t in r["ttft_vision_s"]],
    }


def round_line(number: int, total: int, references: list[dict[str, Any]], ours: Ours) -> str:
    """One round's decode tokens/s per side, so that the spread shows beside the best."""
    ref = {lv.concurrency: lv for lv in reference_levels(references[-1])} if references else {}
    parts = []
    for level in ours.levels:
        base = ref.get(level.concurrency)
        ratio = f" ({level.tokens_per_s() / base.tokens_per_s():.2f}x)" if base else ""
        parts.append(f"c{level.concurrency} {level.tokens_per_s():.2f}{ratio}")
    against = (
        "reference "
        + ", ".join(f"c{c} {lv.tokens_per_s():.2f}" for c, lv in sorted(ref.items()))
        + "; "
        if ref
        else ""
    )
    return f"round {number}/{total}: decode tokens/s {against}{ours.label} {', '.join(parts)}"


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: a mistake exits 2 (argparse) before anything is
    built or measured, and the tests call this in-process rather than start the
    script for each mistake (2 s of start-up each). ``variants`` and
    ``torch_dtype`` carry what the checks made of ``--ours`` and ``--dtype``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (release: 48)")
    parser.add_argument("--vision-depth", type=int, default=2, help="ViT blocks (release: 27)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    parser.add_argument("--levels", default="1,4,8", help="concurrency levels")
    parser.add_argument("--prompt", type=int, default=32, help="text prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=32, help="generated tokens per request")
    parser.add_argument("--image", type=int, default=448, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=2, help="timed image prompts per side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--full",
        action="store_true",
        help="4 layers, 4 ViT blocks, 64 new tokens (about 14 GiB of memory per side)",
    )
    parser.add_argument(
        "--ours",
        default="dense,mixed",
        help="our weight layouts to measure, of: dense (MKL), mixed (all large linear weights "
        "but the experts' packed for oneDNN: the thinker stage's default on the CPU), packed "
        "(the experts too)",
    )
    parser.add_argument("--profile", action="store_true", help="profile our decode steps")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also ours with engine.enable_torch_compile (the decode step compiled per "
        "batch-size bucket; blocked experts loop inside it as one operator), its tokens/s "
        "beside eager's, measured and projected to 48 layers",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="our weights' dtype, the thinker stage's factory.dtype (bfloat16: fast on CPUs with "
        "AMX / AVX512-BF16; oneDNN packing is float32's, so --ours is ignored)",
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="none",
        help="the thinker stage's factory.quantization: int8 weight-only linear layers, experts "
        "included, the LM head not (needs --dtype bfloat16); w8a8_int8: int8 activations too",
    )
    parser.add_argument(
        "--fp16-row-weights",
        action="store_true",
        help="the thinker stage's factory.fp16_row_weights: float16 copies of the blocked bf16 "
        "weights (experts included) for one- and two-row products (needs --dtype bfloat16)",
    )
    parser.add_argument(
        "--reference-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the dtype the reference's thinker runs in (cast after filling, rotary tables kept)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of the reference then ours, alternated (the rounds after the first "
        "measure the last of --ours only); each side's fastest run per level is reported "
        "(default 2, 1 with --smoke)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny thinker, 4 new tokens at concurrency 1 and 2, ours alone, one round "
        "unless --rounds says: checks the script runs (make test)",
    )
    parser.add_argument(
        "--reference-python",
        type=Path,
        default=Path(os.environ.get("QWEN_TTS_REF_PYTHON", "/tmp/qwen-tts-ref/bin/python")),
    )
    args = parser.parse_args(argv)
    if args.full:
        args.layers, args.vision_depth, args.new_tokens = 4, 4, 64
    if args.smoke:
        args.levels, args.new_tokens, args.prompt, args.image, args.repeats = "1,2", 4, 8, 64, 1
    if args.rounds is None:
        args.rounds = 1 if args.smoke else 2
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    variants = [v.strip() for v in args.ours.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        parser.error(f"--ours: unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    try:  # what the stage's loader does with factory.dtype
        dtype = torch_dtype(args.dtype, "cpu")
    except PrecisionError as exc:
        parser.error(f"--dtype {args.dtype}: {exc.message} ({exc.hint})")
    problem = quantization_problem(args.quantization, dtype, torch.device("cpu"))
    if problem is not None:
        parser.error(f"--quantization {args.quantization}: {problem}")
    if args.fp16_row_weights and (dtype != torch.bfloat16 or args.quantization != "none"):
        parser.error("--fp16-row-weights copies bf16 weights: add --dtype bfloat16, without int8")
    args.variants, args.torch_dtype = variants, dtype
    return args


def main() -> int:
    ask_for_huge_pages()  # as omni's CPU stage processes (plan/pages.py); ours only
    args = arguments()
    variants, dtype = args.variants, args.torch_dtype
    torch.set_num_threads(args.threads)
    levels = [int(c) for c in args.levels.split(",")]
    if not args.smoke and not args.reference_python.exists():
        print(
            f"skipped: no reference environment at {args.reference_python} (set "
            "QWEN_TTS_REF_PYTHON or --reference-python; see plugins/qwen3_tts/tests/REFERENCE.md)"
        )
        return 0
    started = time.perf_counter()
    parts = sections(args.layers, args.vision_depth, tiny=args.smoke)
    cfg = ThinkerConfig.from_dict(
        {
            "text_config": parts["text"],
            "vision_config": parts["vision"],
            "audio_config": {"output_dim": parts["text"]["hidden_size"]},
            **IDS,
        }
    )
    inputs = make_inputs(levels, args.prompt, args.image, args.seed)
    width = "a tiny" if args.smoke else "the release's"
    print(
        f"Qwen3-OMNI thinker at {width} width, "
        f"{args.layers} of 48 layers, vision "
        f"{args.vision_depth} of 27 blocks ({len(parts['vision']['deepstack_visual_indexes'])} "
        f"deepstack), ours {args.dtype} (quantization {args.quantization}), reference "
        f"{args.reference_dtype}, on cpu, {args.threads} torch thread(s); image "
        f"{args.image}x{args.image} -> grid {inputs.grid}, {len(inputs.image_ids)} prompt tokens"
    )
    job = {
        "threads": args.threads,
        "seed": args.seed,
        **parts,
        "ids": IDS,
        "levels": levels,
        "new_tokens": args.new_tokens,
        "ttft_repeats": args.repeats,
        "dtype": args.reference_dtype,
    }
    limit_size = (16, 1) if args.smoke else (512, 10)  # MB, passes
    bandwidth = read_bandwidth(*limit_size)
    references: list[dict[str, Any]] = []

    def run_reference_round() -> None:
        if args.smoke:
            return
        with tempfile.TemporaryDirectory(prefix="omni-thinker-bench-") as tmp:
            one = run_reference(args.reference_python, job, inputs, Path(tmp))
        references.append(one)
        print(
            f"reference: built and filled in {one['build_s']:.1f} s, ran in "
            f"{one['wall_s']:.0f} s, {one['threads']} thread(s), peak memory "
            f"{gib(one['peak_rss_bytes'])}"
        )

    run_reference_round()
    reference = references[0] if references else None

    built = time.perf_counter()
    lm, vision = build_ours(cfg, args.seed)
    params = sum(p.numel() for p in lm.parameters())
    same = "not compared (--smoke)"
    if reference is not None:
        problems = check_same_weights(lm, vision, reference["manifest"])
        same = "yes" if not problems else "NO: " + "; ".join(problems[:5])
    print(
        f"ours: {params / 1e9:.2f} B decoder parameters built and filled in "
        f"{time.perf_counter() - built:.1f} s; same names, shapes and values as the reference: "
        + same
    )
    if not packing_available():
        variants = ["dense"]
    names = {variant: f"ours {variant}" for variant in VARIANTS}
    if dtype != torch.float32:  # oneDNN packs float32 weights only: one layout to measure
        variants = ["dense"]
        names["dense"] = f"ours {args.quantization}" if args.quantization != "none" else "ours bf16"
        cast(lm, dtype)
        cast(vision, dtype)
    runs, packed = [], 0
    if dtype != torch.float32:  # the stage's factory.pack_weights (this machine's bf16 routes)
        packed += pack_decoder_weights(lm)
    # int8 weight-only layers, experts included, as the thinker stage does (after packing,
    # which only float32 weights take)
    quantized = apply_quantization(lm, args.quantization, stage="thinker")
    copies = apply_row_copies(lm, args.fp16_row_weights, stage="thinker")
    dedicate(args.threads)  # what a stage process does once built (engine/compute.py)

    common = (lm, vision, cfg, inputs, levels, args.new_tokens, args.repeats)

    for variant in VARIANTS:  # dense first: packing happens in place and cannot be undone
        if variant not in variants:
            continue
        if variant == "mixed":  # all but the experts, as the thinker stage does
            packed += pack_decoder_weights(lm)
        elif variant == "packed":  # every large linear layer, the experts too
            packed += pack_linear_weights(lm)
        profile = args.profile and variant == variants[-1]
        runs.append(measure(names[variant], common, profile))
    rounds = [runs[-1]]
    for attempt in range(2, args.rounds + 1):
        # The sides alternate (the reference, then the stage's layout), so that a slow
        # spell of the shared machine does not fall on one side only; each keeps its
        # fastest run per level.
        if attempt == 2:
            print(round_line(1, args.rounds, references, rounds[-1]))
        run_reference_round()
        rounds.append(measure(rounds[0].label, common, False))
        print(round_line(attempt, args.rounds, references, rounds[-1]))
    runs[-1] = fastest_ours(rounds)
    if references:
        reference = fastest_reference(references)
    # last: the same weights, the eager figures already taken
    compiled = None
    if args.compile:
        compiled = measure(runs[-1].label + " compiled", common, False, compiled=True)
    print(
        f"ours: {packed} linear layers packed for oneDNN in all, {quantized} "
        f"{'w8a8_int8' if args.quantization == 'w8a8_int8' else 'int8'}, {copies} "
        "with float16 row copies; torch threads "
        f"in the engine's "
        f"worker: {runs[-1].threads_in_engine}; peak memory "
        f"{gib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}"
    )
    del lm, vision, common  # the limit is measured again with the memory free, the higher kept
    bandwidth = best(bandwidth, read_bandwidth(*limit_size))
    if reference is None:
        report_ours(runs, args.new_tokens, args.prompt)
    else:
        report(reference, runs, args.layers, args.new_tokens, args.prompt)
    report_limit(runs, cfg, bandwidth, args.prompt, args.new_tokens)
    if compiled is not None:
        report_compiled(runs[-1], compiled, reference, args.layers)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    run_script(main)
