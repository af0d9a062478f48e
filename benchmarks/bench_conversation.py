"""A conversation with the Qwen3-Omni thinker: each turn's time to first token, with the
history copied from the previous turn's slot (the engine's shared prompt heads) and
computed whole (``engine.disable_radix_cache``).

Run: ``python benchmarks/bench_conversation.py [--layers 2] [--dtype bfloat16]
[--system 512] [--turns 4] [--turn 64] [--answer 32] [--threads 2]`` (about two
minutes on two CPU cores, 9 GiB at two layers); ``--smoke``: tiny widths, two short
turns, seconds.

What runs: the thinker's decoder at the release's width (``bench_qwen3_omni_thinker``'s
sections: hidden 2048, 128 experts top-8, vocabulary 152064) with ``--layers`` decoder
layers and seeded random weights, built and packed as the thinker stage builds it,
on the ``TorchEngine`` the stage runs. A chat: a ``--system``-token system prompt,
then ``--turns`` turns, each a ``--turn``-token user message and a greedy
``--answer``-token answer; every turn's prompt is the whole conversation so far
(answers included, as a chat client sends them back) with its three M-RoPE streams.
Each setting runs the whole conversation, taking turns with the other, ``--repeats``
times; each turn's fastest time to first token is kept. Without the cache a turn
computes every position of its prompt; with it, only what follows the previous
turn's prompt and fed answer, in whole blocks of 16. ``--audio N`` leads each user
message with N positions of encoder rows (random, as an audio clip's would be);
``--spoken`` asks for the talker's rows with every step, as the speech pipeline's
thinker stage does (the voice-agent case: its copied heads bring the rows the
talker reads at media positions).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import anyio
import torch

from omni_core.engine.backends import create_engine
from omni_core.engine.compute import dedicate
from omni_core.engine.interface import EngineSettings, SamplingParams
from omni_core.engine.precision import PrecisionError, torch_dtype
from omni_core.engine.prompt import EmbeddedPrompt
from omni_core.sigterm import run_script
from omni_qwen3_omni.config import ThinkerConfig
from omni_qwen3_omni.loading import construct
from omni_qwen3_omni.thinker.cpu_weights import pack_decoder_weights
from omni_qwen3_omni.thinker.decoder import ThinkerLM
from omni_qwen3_omni.thinker.step import ThinkerStepModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_qwen3_omni_thinker as thinker_bench  # its sizes and weight filling


def build(layers: int, dtype: torch.dtype, seed: int, tiny: bool) -> ThinkerStepModel:
    """The decoder at the release's width (or a tiny one), filled, cast and packed."""
    parts = thinker_bench.sections(layers, 1, tiny=tiny)
    cfg = ThinkerConfig.from_dict(
        {
            "text_config": parts["text"],
            "vision_config": parts["vision"],
            "audio_config": {"output_dim": parts["text"]["hidden_size"]},
            **thinker_bench.IDS,
        }
    )
    lm = construct(lambda: ThinkerLM(cfg.text), torch.device("cpu"), torch.float32)
    for name, param in lm.named_parameters():
        thinker_bench.runner.fill_parameter(name, param.data, seed)
    if dtype != torch.float32:
        thinker_bench.cast(lm, dtype)
        pack_decoder_weights(lm)  # the thinker stage's factory.pack_weights
    return ThinkerStepModel(lm, cfg.text, eos_ids=set(), device=torch.device("cpu"), dtype=dtype)


def add_thinker_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the thinker these benchmarks build (``bench_long_prompt`` too)."""
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (release: 48)")
    parser.add_argument(
        "--dtype", default="bfloat16", help="weights (the stage's factory.dtype: auto, ...)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)


def thinker_of(args: argparse.Namespace) -> tuple[ThinkerStepModel, torch.dtype] | None:
    """The thinker ``add_thinker_arguments`` describe, on a dedicated compute thread as a
    stage process runs it; None (said on stderr) for a dtype this CPU cannot run."""
    torch.set_num_threads(args.threads)
    try:
        dtype = torch_dtype(args.dtype, "cpu")
    except (PrecisionError, ValueError) as exc:
        print(f"--dtype: {exc}", file=sys.stderr)
        return None
    model = build(args.layers, dtype, args.seed, tiny=args.smoke)
    dedicate(args.threads)  # what a stage process does once built (engine/compute.py)
    return model, dtype


def print_record(args: argparse.Namespace, dtype: torch.dtype, **figures: object) -> None:
    """The run's figures as one ``BENCH_JSON`` line, after the thinker they ran on."""
    record = {
        "layers": args.layers,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": args.threads,
        **figures,
    }
    print("BENCH_JSON " + json.dumps(record))


def prompt_of(ids: list[int], media: dict[int, torch.Tensor] | None = None) -> EmbeddedPrompt:
    """Text with three equal M-RoPE streams; ``media``: encoder rows spliced in by position."""
    flat = torch.arange(len(ids))
    rows = dict(sorted((media or {}).items()))
    return EmbeddedPrompt(
        ids,
        positions=torch.stack([flat, flat, flat]),
        next_position=len(ids),
        embeddings=torch.stack(list(rows.values())) if rows else None,
        embedding_index=torch.tensor(list(rows)) if rows else None,
    )


@dataclass
class Turn:
    """A user message: its ids, and rows an audio encoder would splice in (by offset)."""

    ids: list[int]
    audio: dict[int, torch.Tensor]


async def conversation(
    model: ThinkerStepModel,
    turns: list[Turn],
    system: list[int],
    answer: int,
    radix: bool,
    accept: int | None,
) -> tuple[list[float], list[int], dict[str, int]]:
    """Each turn's time to first token (s) and prompt length; the positions computed/copied.

    ``accept``: spoken turns, whose talker rows (layers 0 and ``accept``) come back with
    every step, as the speech pipeline's thinker stage asks for them.
    """
    total = len(system) + sum(len(t.ids) for t in turns) + answer * len(turns) + 16
    settings = EngineSettings(
        max_running_requests=2,
        max_total_tokens=2 * total,
        max_prefill_tokens=total,
        disable_radix_cache=not radix,
    )
    ttfts, lengths = [], []
    async with create_engine(model, settings, device="cpu") as engine:
        warm = SamplingParams(0.0, max_new_tokens=2)  # the first call at a shape pays more
        _ = [t async for t in engine.enqueue("warm", prompt_of([11, 12, 13]), warm)]
        engine.prompt_positions.update(computed=0, cached=0)
        history, media = list(system), {}
        for number, message in enumerate(turns):
            media.update({len(history) + at: row for at, row in message.audio.items()})
            history += message.ids
            lengths.append(len(history))
            sampling = SamplingParams(0.0, max_new_tokens=answer)
            name = f"turn{number}"
            if accept is not None:
                model.capture(name, accept)
            begin, first, said = time.perf_counter(), None, []
            async for out in engine.enqueue(name, prompt_of(history, media), sampling):
                if first is None:
                    first = time.perf_counter() - begin
                said.append(int(out["token"] if isinstance(out, dict) else out))
            model.release(name)
            ttfts.append(float(first))
            history += said  # the client sends the answer back with the next turn
        counts = dict(engine.prompt_positions)
    return ttfts, lengths, counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_thinker_arguments(parser)
    parser.add_argument("--system", type=int, default=512, help="system prompt tokens")
    parser.add_argument("--turns", type=int, default=4, help="user turns")
    parser.add_argument("--turn", type=int, default=64, help="tokens per user message")
    parser.add_argument("--answer", type=int, default=32, help="tokens per answer (greedy)")
    parser.add_argument(
        "--audio",
        type=int,
        default=0,
        help="audio positions leading each user message (rows an encoder splices in)",
    )
    parser.add_argument(
        "--spoken",
        action="store_true",
        help="spoken turns: the talker's rows come back with each step (a speech deployment)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="conversations per setting")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny widths, two short turns: checks the script runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.system, args.turns, args.turn, args.answer, args.repeats = 40, 2, 8, 4, 1
        args.audio, args.spoken = 6, True  # every path: media rows and the talker's
    started = time.perf_counter()
    built = thinker_of(args)
    if built is None:
        return 2
    model, dtype = built
    rng = random.Random(args.seed)

    def text(n: int) -> list[int]:
        return [rng.randrange(thinker_bench.PLAIN_VOCAB) for _ in range(n)]

    hidden = model.config.hidden_size
    noise = torch.Generator().manual_seed(args.seed)
    audio_id = thinker_bench.IDS["audio_token_id"]
    system = text(args.system)
    turns = [
        Turn(
            [audio_id] * args.audio + text(args.turn),
            {at: torch.randn(hidden, generator=noise) for at in range(args.audio)},
        )
        for _ in range(args.turns)
    ]
    accept = None
    if args.spoken:  # what the speech pipeline's thinker stage sets up (stages.py)
        accept = model.config.num_hidden_layers
        model.expected_captures = (accept,)
    width = "a tiny" if args.smoke else "the release's"
    print(
        f"Qwen3-Omni thinker at {width} width, {args.layers} of 48 layers, "
        f"{str(dtype).removeprefix('torch.')}, "
        f"{args.threads} torch thread(s), built in {time.perf_counter() - started:.1f} s; "
        f"a {args.system}-token system prompt, {args.turns} turns of {args.turn} tokens"
        + (f" after {args.audio} audio positions" if args.audio else "")
        + f", {args.answer}-token answers"
        + (", spoken (the talker's rows captured)" if args.spoken else "")
    )
    best: dict[bool, list[float]] = {}
    counts: dict[bool, dict[str, int]] = {}
    lengths: list[int] = []
    for _ in range(args.repeats):
        for radix in (False, True):
            ttfts, lengths, counts[radix] = anyio.run(
                conversation, model, turns, system, args.answer, radix, accept
            )
            old = best.get(radix, ttfts)
            best[radix] = [min(a, b) for a, b in zip(old, ttfts, strict=True)]
    print("\nturn  prompt  first token s (computed whole)  (history copied)  ratio")
    for number, length in enumerate(lengths):
        whole, copied = best[False][number], best[True][number]
        print(
            f"{number + 1:>4}  {length:>6}  {whole:>29.3f}  {copied:>16.3f}  "
            f"{whole / copied:>5.2f}x"
        )
    whole_s, copied_s = sum(best[False]), sum(best[True])
    print(
        f"all turns: {whole_s:.2f} s -> {copied_s:.2f} s ({whole_s / copied_s:.2f}x); prompt "
        f"positions computed {counts[False]['computed']} -> {counts[True]['computed']}, "
        f"copied {counts[True]['cached']}"
    )
    print_record(
        args,
        dtype,
        audio=args.audio,
        spoken=args.spoken,
        prompt_lengths=lengths,
        ttft_whole_s=best[False],
        ttft_copied_s=best[True],
        positions_whole=counts[False],
        positions_copied=counts[True],
    )
    return 0


if __name__ == "__main__":
    run_script(main)
