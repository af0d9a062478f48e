"""Memory of N Qwen3-TTS replicas that share their weights, beside N that do not.

Run: ``python benchmarks/bench_weight_share.py [--replicas 2] [--size 0.6B]
[--no-pack]`` (about 3 minutes at 0.6B on two CPU cores: each unshared
replica fills 1.2 billion dummy weights; the followers map theirs in seconds;
the two unshared 0.6B replicas need about 10 GB of free memory at once).
``--smoke`` runs the tiny preset, two replicas, two frames: it checks that the
script runs (seconds, ``make test``).

What it does: for ``weight_share = off`` and ``on``, start N replicas of the
Qwen3-TTS pipeline on the CPU (dummy weights at the release's sizes: the
checkpoint directory holds configs only), send each replica the same seeded
request, and read every process's proportional set size (``Pss`` in
``/proc/PID/smaps_rollup``: a page mapped by two processes counts half in
each, so the sum is what the machine really holds). It prints the PSS per
process, the sum, start-up times, and whether the shared replicas' audio
equals the unshared ones'. The Qwen3-TTS engine stage repacks its large
linear weights for oneDNN unless ``--no-pack``; with sharing, a repacked layer
keeps reading the shared bytes: the script also times one talker-sized layer
through its private oneDNN copy and through the shared dense view (the same
oneDNN kernel) and checks that both give the same bits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omni_core.sigterm import run_script

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "qwen3_tts_demo.toml"
GiB = 1024**3


def pss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss line for process {pid}")


async def speak(runtime: Any, request: dict[str, Any]) -> bytes:
    """The audio the request streams (float32 samples, as bytes: compared exactly)."""
    import numpy as np

    handle = await runtime.dispatch(dict(request))
    chunks = [
        np.asarray(event.data, dtype=np.float32).ravel()
        async for event in handle.stream()
        if not event.final and not isinstance(event.data, dict)
    ]
    if not chunks:
        raise RuntimeError("the request streamed no audio")
    return np.concatenate(chunks).tobytes()


async def measure(
    base: Path, model_path: str, replicas: int, share: str, pack: bool, frames: int
) -> dict[str, Any]:
    """Start ``replicas`` replicas, one request each; PSS per process and the audio."""
    from omni_core.harness import plan_on_cpu
    from omni_core.plugins import OmniPlugins

    flags = [
        "--model_path",
        model_path,
        "--processes.pipeline.num_replicas",
        str(replicas),
        "--weight_share",
        share,
        "--runtime.binding",
        "round-robin",
        "--runtime.startup_timeout",
        "1200",
        "--tts_engine.engine.max_total_tokens",
        "1024",
        "--tts_engine.factory.dtype",  # float32: the layers oneDNN repacks
        "float32",
        "--tts_engine.factory.pack_weights",
        "true" if pack else "false",
    ]
    planned = plan_on_cpu(OmniPlugins(), base, deploy=DEMO, flags=flags)
    request = {"input": "Hello there", "voice": "serena", "seed": 3, "max_frames": frames}
    started = time.perf_counter()
    ready: dict[str, float] = {}

    def progress(kind: str, name: str, detail: dict[str, Any]) -> None:
        if kind == "ready":
            ready[name] = detail["seconds"]

    async with planned.runtime(on_progress=progress) as runtime:
        start_seconds = time.perf_counter() - started
        audio = [await speak(runtime, request) for _ in range(replicas)]
        pss = {c.name: pss_bytes(c.proc.pid) for c in runtime.children.values()}
    return {"pss": pss, "audio": audio, "start": start_seconds, "ready": ready}


def linear_layouts(smoke: bool) -> None:
    """A repacked layer over a shared weight reads the dense mapped bytes, not a private
    oneDNN copy: time both (the same kernel) and check that they compute the same bits."""
    import torch

    from omni_core.engine.cpu_linear import PackedLinear, packing_available
    from omni_core.runtime.weight_share import host

    if not packing_available():
        print("  oneDNN repacking: not available in this torch build")
        return
    torch.set_num_threads(1)  # one thread: the kernel's speed, not the machine's load
    out_features, in_features = (64, 32) if smoke else (3072, 1024)  # the talker's MLP
    layer = torch.nn.Linear(in_features, out_features, bias=False)
    private = PackedLinear(layer)
    _, fd, _ = host.publish(layer)
    os.close(fd)  # the mapping keeps the memory
    shared = PackedLinear(layer)
    repeats = 3 if smoke else 300
    for rows in (1, 8):
        x = torch.randn(rows, in_features)
        timings = {}
        for name, module in (("private oneDNN copy", private), ("shared dense view", shared)):
            module(x)  # warm-up: oneDNN builds its primitive on the first call
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                for _ in range(repeats):
                    module(x)
                best = min(best, (time.perf_counter() - started) / repeats)
            timings[name] = best
        same = torch.equal(private(x), shared(x))
        print(
            f"  linear {out_features}x{in_features}, {rows} row(s): "
            + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in timings.items())
            + f"; equal: {same}"
        )


def report(share: str, result: dict[str, Any]) -> None:
    for name, value in result["pss"].items():
        print(
            f"  weight_share={share:<3} {name:<14} PSS {value / GiB:6.2f} GiB  "
            f"ready in {result['ready'].get(name, 0.0):6.1f} s"
        )
    total = sum(result["pss"].values())
    print(
        f"  weight_share={share:<3} total PSS {total / GiB:6.2f} GiB  "
        f"(all ready in {result['start']:.1f} s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2, help="replicas per run (default 2)")
    parser.add_argument("--size", choices=("tiny", "0.6B", "1.7B"), default="0.6B")
    parser.add_argument("--frames", type=int, default=8, help="frames per request")
    parser.add_argument("--no-pack", action="store_true", help="skip the oneDNN repacking")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny preset, two replicas, two frames (seconds)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.replicas, args.size, args.frames = 2, "tiny", 2
    from bench_qwen3_tts import write_configs

    from omni_core.harness import short_private_dir

    print(
        f"weight sharing: {args.replicas} Qwen3-TTS replicas at {args.size} on the CPU, "
        f"{'no repacking' if args.no_pack else 'oneDNN repacking'} (a shared machine: "
        "start-up times vary with its load; PSS does not)"
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="omni-bws-") as scratch:
        checkpoint = Path(scratch) / "ckpt"
        write_configs(checkpoint, args.frames, args.size)
        for share in ("off", "on"):
            with short_private_dir("omni-bws") as base:
                results[share] = asyncio.run(
                    measure(
                        base, str(checkpoint), args.replicas, share, not args.no_pack, args.frames
                    )
                )
            report(share, results[share])
    linear_layouts(args.smoke)
    unshared = sum(results["off"]["pss"].values())
    shared = sum(results["on"]["pss"].values())
    one = max(results["off"]["pss"].values())
    same = results["on"]["audio"] == results["off"]["audio"]
    print(f"  shared / unshared total PSS: {shared / unshared:.2f}")
    print(
        f"  shared total / one unshared replica: {shared / one:.2f} "
        "(acceptance at release size: <= 1.2)"
    )
    print(f"  audio of the shared replicas equals the unshared ones': {same}")
    return 0 if same else 1


if __name__ == "__main__":
    run_script(main)
