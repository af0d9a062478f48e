"""Linear layers at decoding batch sizes on the CPU: MKL (``F.linear``) vs oneDNN-packed.

Run: ``python benchmarks/bench_cpu_linear.py [--threads 2] [--layers 40]``
(about half a minute; ``--smoke``: two layers, one pass, a second or two).

Why: a decode step reads every weight once for a few rows, so the figure
that matters is how fast weights stream from memory. The script builds
``--layers`` distinct weights of each shape (together far larger than the
caches, so every call reads DRAM), runs each batch size over all of them and
reports the best of five passes as milliseconds per layer and weight GB/s,
next to a plain ``sum`` over 512 MB (the machine's read bandwidth). The
shapes are Qwen3-TTS 0.6B's (talker and code predictor share them):
q/gate/up ``1024 -> 3072``-ish and down ``3072 -> 1024``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.cpu_linear import PackedLinear, packing_available

SHAPES = {"gate/up 1024->3072": (1024, 3072), "down 3072->1024": (3072, 1024)}
ROWS = (1, 2, 4, 8, 16)


def best_per_layer(run, layers: int, passes: int) -> float:
    run()
    best = float("inf")
    for _ in range(passes):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best / layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=40)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one repeat: checks the script runs (make test)",
    )
    args = parser.parse_args()
    rows, passes, read_mb = ROWS, 5, 512
    if args.smoke:
        args.layers, rows, passes, read_mb = 2, ROWS[:2], 1, 16
    torch.set_num_threads(args.threads)
    if not packing_available():
        raise SystemExit("this torch build cannot run oneDNN-packed linear layers")
    big = torch.ones(read_mb * 1024 * 1024 // 4)
    big.sum()
    started = time.perf_counter()
    big.sum()
    seconds = time.perf_counter() - started
    print(f"memory read bandwidth (sum over {read_mb} MB): {read_mb / 1e3 / seconds:.1f} GB/s")
    del big
    with torch.inference_mode():
        for label, (k, n) in SHAPES.items():
            dense = [nn.Linear(k, n, bias=False) for _ in range(args.layers)]
            packed = [PackedLinear(layer) for layer in dense]
            megabytes = k * n * 4 / 1e6
            print(f"\n{label} ({megabytes:.1f} MB per weight), ms per layer (weight GB/s):")
            print(f"{'rows':>5} {'MKL F.linear':>20} {'oneDNN packed':>20} {'speed-up':>9}")
            weights = [d.weight for d in dense]
            for row_count in rows:
                x = torch.randn(row_count, k)
                mkl = best_per_layer(
                    lambda x=x, ws=weights: [F.linear(x, w) for w in ws], args.layers, passes
                )
                onednn = best_per_layer(
                    lambda x=x, ps=packed: [p(x) for p in ps], args.layers, passes
                )
                gb_mkl, gb_onednn = megabytes / 1e3 / mkl, megabytes / 1e3 / onednn
                print(
                    f"{row_count:>5} {mkl * 1e3:>10.3f} ({gb_mkl:>5.1f})"
                    f" {onednn * 1e3:>11.3f} ({gb_onednn:>5.1f}) {mkl / onednn:>8.2f}x"
                )


if __name__ == "__main__":
    main()
