"""Tensor parallelism on the CPU: decode tokens/s of one process against two ranks.

Run: ``python benchmarks/bench_tensor_parallel.py [--layers 4] [--new-tokens 32]``
(about a minute on two cores, each process peaking near 1 GiB at the
defaults); ``--smoke`` runs a tiny model in seconds (a check that the
benchmark works, not a figure).

What runs: the Qwen3-Omni thinker's decoder (``ThinkerLM`` + ``ThinkerStepModel``
over the ``TorchEngine``, as the thinker stage runs it, weights repacked for
oneDNN) at the release's attention width (hidden 2048, 32 query / 4 KV heads of
head_dim 128) with a dense SwiGLU of ``--intermediate`` (6144: a dense Qwen3
block; ``--experts N`` makes the layers sparse instead), ``--layers`` layers
and a ``--vocab`` of 8192 (the release's 152064-row LM head stays whole on
rank 0 and would swamp what is split). Float32, seeded random weights, greedy.
Three layouts, one after the other:

* ``1 process, 1 thread``, then ``1 process, 2 threads`` (torch's intra-op
  threads split each matmul), one fresh process measured at each count;
* ``tp 2, 1 thread each``: two fresh rank processes joined over gloo (the split
  ``omni_core.engine.tp`` runs: rank 0 mirrors every pass, one all-reduce
  after attention and one after the MLP per layer).

Figures: decode tokens/s at each concurrency ``c`` (``c`` prompts of
``--prompt`` tokens at once, ``--new-tokens`` each; time from every request's
first token to the last, tokens after each first), and the milliseconds of a
decode step. Decoding streams every weight once per step, so on one socket
the two layouts share one memory bus and TP adds a few all-reduces per layer
to what threads do; TP pays where each rank gets memory bandwidth of its own
(one rank per socket) or a GPU of its own. The machine may be shared with
other work: compare layouts of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from omni_core.sigterm import run_script

# (tp, thread counts): one process is measured at each count in turn (one start-up)
RUNS = [(1, [1, 2]), (2, [1])]


def _config(args: argparse.Namespace):
    from omni_qwen3_omni.config import TextConfig

    if args.smoke:
        return TextConfig(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            mrope_section=(4, 2, 2),
            num_experts=0,
        )
    sparse = args.experts > 0
    return TextConfig(
        vocab_size=args.vocab,
        hidden_size=2048,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=args.experts,
        num_experts_per_tok=min(8, args.experts) if sparse else 8,
        moe_intermediate_size=768,
    )


def _rank(args: argparse.Namespace) -> None:
    """One process of one layout: rank 0 (or the only process) measures and prints JSON."""
    import anyio
    import torch

    torch.manual_seed(0)
    from omni_core.engine.backends import create_engine
    from omni_core.engine.cpu_linear import pack_linear_weights
    from omni_core.engine.interface import CacheLayout, EngineSettings
    from omni_core.engine.tp import FollowerStage, Mirror, init_group, leave_group
    from omni_qwen3_omni.thinker.decoder import ThinkerLM
    from omni_qwen3_omni.thinker.step import ThinkerStepModel
    from omni_qwen3_omni.thinker.tensor_parallel import follower_forward, shard_thinker

    cfg = _config(args)
    with torch.no_grad():
        lm = ThinkerLM(cfg).eval()
    group = None
    if args.tp > 1:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        group = init_group(
            name="bench",
            rank=args.rank,
            size=args.tp,
            store_path=args.store,
            backend="gloo",
            device="cpu",
            timeout=600,
        )
        shard_thinker(lm, cfg, group)
    pack_linear_weights(lm, skip=lambda name: ".experts." in name)
    settings = EngineSettings(max_running_requests=max(args.concurrency), max_total_tokens=8192)

    async def lead() -> dict:
        mirror = Mirror(group) if group is not None else None
        model = ThinkerStepModel(
            lm,
            cfg,
            eos_ids=set(),
            device=torch.device("cpu"),
            dtype=torch.float32,
            mirror=mirror,
            tp_size=args.tp,
        )
        engine = create_engine(model, settings, device="cpu")
        if mirror is not None:
            mirror.setup(engine.plan.num_slots, engine.plan.slot_len)
        figures = {}
        for c in args.concurrency:
            firsts: dict[int, float] = {}
            lasts: dict[int, float] = {}
            async with anyio.create_task_group() as tg:
                for i in range(c):
                    tg.start_soon(_decode, engine, cfg, args, f"c{c}-{i}", i, firsts, lasts)
            seconds = max(lasts.values()) - max(firsts.values())
            tokens = c * (args.new_tokens - 1)
            figures[c] = {
                "tokens_per_s": tokens / seconds,
                "step_ms": 1000 * seconds / (args.new_tokens - 1),
            }
        await engine.aclose()
        if mirror is not None:
            mirror.close()
        return figures

    async def follow() -> None:
        layout = CacheLayout(
            cfg.num_hidden_layers,
            cfg.num_key_value_heads // args.tp,
            cfg.head_dim,
            torch.float32,
            torch.device("cpu"),
        )
        stage = FollowerStage(group, layout, follower_forward(lm), stage="bench")
        await stage.start()
        await anyio.to_thread.run_sync(stage.join)

    if args.rank == 0:
        figures = {}
        for threads in args.threads:
            torch.set_num_threads(threads)
            figures[threads] = anyio.run(lead)
        print(json.dumps(figures), flush=True)
    else:
        torch.set_num_threads(args.threads[0])
        anyio.run(follow)
    if group is not None:
        leave_group()


async def _decode(engine, cfg, args, name: str, i: int, firsts: dict, lasts: dict) -> None:
    """One greedy request; when its first and last tokens came."""
    from omni_core.engine.interface import SamplingParams
    from omni_core.engine.prompt import EmbeddedPrompt

    ids = [(7 * i + j) % cfg.vocab_size for j in range(args.prompt)]
    greedy = SamplingParams(temperature=0, max_new_tokens=args.new_tokens)
    async with engine.enqueue(name, EmbeddedPrompt(token_ids=ids), greedy) as stream:
        async for _ in stream:
            now = time.perf_counter()
            firsts.setdefault(i, now)
            lasts[i] = now


def _layout(args: argparse.Namespace, tp: int, threads: list[int]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(max(threads))}
    with tempfile.TemporaryDirectory(prefix="omni-bench-tp-") as tmp:
        common = [sys.executable, __file__, "--threads", *map(str, threads), "--tp", str(tp)]
        common += ["--store", os.path.join(tmp, "store"), *_passed(args)]
        procs = [
            subprocess.Popen(
                [*common, "--rank", str(r)], env=env, stdout=subprocess.PIPE, text=True
            )
            for r in range(tp)
        ]
        outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed (tp {tp}, {threads} threads)")
    figures = json.loads(outputs[0].strip().splitlines()[-1])
    return {int(n): {int(c): v for c, v in by_c.items()} for n, by_c in figures.items()}


def _passed(args: argparse.Namespace) -> list[str]:
    out = ["--layers", str(args.layers), "--intermediate", str(args.intermediate)]
    out += ["--experts", str(args.experts), "--vocab", str(args.vocab)]
    out += ["--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens)]
    out += ["--concurrency", *map(str, args.concurrency)]
    return out + (["--smoke"] if args.smoke else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=6144)
    parser.add_argument("--experts", type=int, default=0, help="sparse layers of N experts")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--smoke", action="store_true", help="a tiny model, seconds")
    # internal: one process of a layout
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help=argparse.SUPPRESS)
    parser.add_argument("--store", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.new_tokens, args.concurrency = 4, [1, 2]
    if args.rank is not None:
        _rank(args)
        return
    what = (
        "tiny model (--smoke)"
        if args.smoke
        else (
            f"hidden 2048, {args.layers} layers, "
            + (f"{args.experts} experts" if args.experts else f"dense MLP {args.intermediate}")
            + f", vocab {args.vocab}"
        )
    )
    print(f"thinker decoder, {what}; float32, greedy, {args.new_tokens} new tokens")
    print(
        f"{'layout':<24}"
        + "".join(f"{'c=' + str(c) + ' tok/s':>14}{'step ms':>10}" for c in args.concurrency)
    )
    for tp, threads in RUNS:
        for n, figures in _layout(args, tp, threads).items():
            name = (
                f"1 process, {n} thread{'s' if n > 1 else ''}"
                if tp == 1
                else f"tp {tp}, {n} thread each"
            )
            row = "".join(
                f"{figures[c]['tokens_per_s']:>14.1f}{figures[c]['step_ms']:>10.1f}"
                for c in args.concurrency
            )
            print(f"{name:<24}{row}", flush=True)


if __name__ == "__main__":
    run_script(main)
