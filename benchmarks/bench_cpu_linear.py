"""Linear layers at decoding batch sizes on the CPU: float32 MKL vs oneDNN, bf16, int8.

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

Beside float32 (MKL's ``F.linear`` and oneDNN's inner product, between
which the CPU stages' ``PackedLinear`` picks by row count: MKL up to
``MKL_MAX_ROWS``, printed below) it times the two cheaper layouts ``factory.dtype`` and
``factory.quantization`` choose: bfloat16 ``F.linear`` (oneDNN, AMX where
the CPU has it), ``RowLinear`` (the bf16 layer the CPU stages use: a
lone row through ``torch.mv``), ``BlockedLinear`` (the bf16 weight reordered
to oneDNN's blocked layout: the same speed as ``F.linear`` on the Intel
machine, 1.9x it on an AMD EPYC, so the stages take it where this machine's
routes say so), ``Int8Linear`` (int8 weights, bf16 activations,
``aten._weight_int8pack_mm``) and ``W8A8Linear`` (``w8a8_int8``: int8
weights, each row of the activations quantised to int8 at the call, oneDNN's
integer kernel; its column repeats int8's where this machine cannot run it).
GB/s counts each layout's own bytes; the speed-up columns are against
float32 MKL.

Last, bf16 sibling projections (a Qwen3 layer's q/k/v, then gate/up) as
separate ``RowLinear`` products and fused into one per group
(``omni_core.engine.fused_linear``, what ``pack_linear_weights`` does).
And each layout's cost per call apart from reading (a 64x64 product of one
row, whose weight sits in L1): what a decode step of hundreds of small
products pays on top of its weights' bytes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.cpu_kernel_choice import KernelChoice, kernel_choice
from omni_core.engine.cpu_linear import (
    MKL_MAX_ROWS,
    BlockedLinear,
    RowLinear,
    blocking_available,
    packing_available,
    use_routes,
)
from omni_core.engine.fused_linear import fuse_projections, project
from omni_core.engine.quantize import Int8Linear
from omni_core.engine.w8a8 import W8A8Linear, quantize_rows, w8a8_problem
from omni_core.sigterm import run_script

ONEDNN = torch.ops.mkldnn._linear_pointwise  # what PackedLinear calls beyond MKL_MAX_ROWS rows
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
    print(f"PackedLinear (float32 stages): MKL up to {MKL_MAX_ROWS} rows, oneDNN beyond")
    mine = kernel_choice()  # what a stage on this machine takes instead (measured, cached)
    print(
        f"this machine's routes ({mine.source}): MKL up to {mine.mkl_max_rows} float32 rows; "
        f"a lone bf16 row through {'torch.mv' if mine.bf16_mv_one_row else 'F.linear'}; "
        f"the bf16 transposed product up to {mine.bf16_transposed_max_rows} rows; "
        f"bf16 weights {'blocked for oneDNN' if mine.bf16_blocked else 'dense'}"
        + (
            f", fewer rows padded to {mine.bf16_blocked_min_rows}"
            if mine.bf16_blocked_min_rows
            else ""
        )
        + " (the RowLinear column below takes the shipped routes; the blocked one pads as "
        "they do)"
    )
    # the shipped routes for RowLinear's column, this machine's padding for the blocked one's
    use_routes(replace(KernelChoice(), bf16_blocked_min_rows=mine.bf16_blocked_min_rows))
    del big
    with torch.inference_mode():
        for label, (k, n) in SHAPES.items():
            dense = [nn.Linear(k, n, bias=False) for _ in range(args.layers)]
            packed = [layer.weight for layer in dense]  # oneDNN reads the dense weight
            half = [layer.weight.detach().to(torch.bfloat16) for layer in dense]
            routed = [nn.Linear(k, n, bias=False).to(torch.bfloat16) for _ in dense]
            for layer in routed:
                layer.__class__ = RowLinear  # what pack_linear_weights makes of a bf16 layer
            int8 = [Int8Linear(nn.Linear(k, n, bias=False).to(torch.bfloat16)) for _ in dense]
            w8a8 = (
                [W8A8Linear(nn.Linear(k, n, bias=False).weight, None) for _ in dense]
                if w8a8_problem() is None
                else int8  # no oneDNN int8 kernel here: the column repeats int8's
            )
            blocked = (
                [BlockedLinear(nn.Linear(k, n, bias=False).to(torch.bfloat16)) for _ in dense]
                if blocking_available()
                else routed  # no oneDNN bf16 here: the column repeats RowLinear's
            )
            elements = k * n / 1e9  # GB per byte of element size
            print(f"\n{label} ({elements * 4e3:.1f} MB per float32 weight), ms per layer (GB/s):")
            print(
                f"{'rows':>5} {'fp32 MKL':>17} {'fp32 oneDNN':>17} {'bf16 F.linear':>17}"
                f" {'bf16 RowLinear':>17} {'bf16 blocked':>17} {'int8 (bf16 x)':>17}"
                f" {'w8a8 (int8 x)':>17}"
                "   speed-up oneDNN / bf16 / bf16 row / bf16 blocked / int8 / w8a8"
            )
            weights = [d.weight for d in dense]
            for row_count in rows:
                x = torch.randn(row_count, k)
                xb = x.to(torch.bfloat16)
                runs = [
                    (x, lambda x, w: F.linear(x, w), weights),
                    (x, lambda x, w: ONEDNN(x, w, None, "none", [], ""), packed),
                    (xb, lambda x, w: F.linear(x, w), half),
                    (xb, lambda x, r: r(x), routed),
                    (xb, lambda x, b: b(x), blocked),
                    (xb, lambda x, q: q(x), int8),
                    (xb, lambda x, q: q(x), w8a8),
                ]
                times = [
                    best_per_layer(
                        lambda x=x, call=call, items=items: [call(x, i) for i in items],
                        args.layers,
                        passes,
                    )
                    for x, call, items in runs
                ]
                sizes = (4, 4, 2, 2, 2, 1, 1)
                cells = [
                    f"{t * 1e3:>8.3f} ({elements * b / t:>5.1f})"
                    for t, b in zip(times, sizes, strict=True)
                ]
                ups = " / ".join(f"{times[0] / t:.2f}x" for t in times[1:])
                print(f"{row_count:>5} {' '.join(f'{c:>17}' for c in cells)}   {ups}")
        print_fused(args.layers, rows, passes)
        print_call_cost(50 if args.smoke else 2000)


#: A Qwen3-TTS 0.6B layer's projections that read one input: q/k/v, gate/up.
SIBLINGS = ((1024, (2048, 1024, 1024)), (1024, (3072, 3072)))


def print_fused(layers: int, rows: tuple[int, ...], passes: int) -> None:
    """bf16 sibling projections, separate against fused, over ``layers`` layers' worth."""

    def group(k: int, outs: tuple[int, ...]) -> list[nn.Linear]:
        members = [nn.Linear(k, n, bias=False).to(torch.bfloat16) for n in outs]
        for layer in members:
            layer.__class__ = RowLinear
        return members

    separate = [group(k, outs) for _ in range(layers) for k, outs in SIBLINGS]
    fused = [group(k, outs) for _ in range(layers) for k, outs in SIBLINGS]
    fuse_projections(fused, kinds=(RowLinear,))
    gigabytes = sum(layer.weight.numel() * 2 for g in separate for layer in g) / 1e9
    print(f"\nbf16 q/k/v + gate/up of {layers} layers ({gigabytes * 1e3:.0f} MB), GB/s:")
    print(f"{'rows':>5} {'separate':>9} {'fused':>9}")
    for row_count in rows:
        x = torch.randn(row_count, 1024).to(torch.bfloat16)
        times = [
            best_per_layer(lambda x=x, gs=groups: [project(x, *g) for g in gs], 1, passes)
            for groups in (separate, fused)
        ]
        print(f"{row_count:>5} {gigabytes / times[0]:>9.1f} {gigabytes / times[1]:>9.1f}")


def print_call_cost(calls: int) -> None:
    """Each layout's cost per call apart from reading: a 64x64 product of one row.

    Its weight sits in L1, so the median call is what a layout pays before
    its kernel reads anything; a decode step pays it once per product
    (Qwen3-TTS: 412 products a frame). On the 2-vCPU Intel Xeon of
    2026-12-08: float32 ``F.linear`` 2.6 us, oneDNN's int8 kernel 26 us
    (``onednn::qlinear_pointwise`` builds its primitive's descriptor every
    call), 11 ms of a 104 ms ``w8a8_int8`` step.
    """
    k = n = 64
    dense = nn.Linear(k, n, bias=False)
    x = torch.randn(1, k)
    xb = x.to(torch.bfloat16)
    routed = nn.Linear(k, n, bias=False).to(torch.bfloat16)
    routed.__class__ = RowLinear
    int8 = Int8Linear(nn.Linear(k, n, bias=False).to(torch.bfloat16))
    layouts: dict[str, Any] = {
        "fp32 MKL": lambda: F.linear(x, dense.weight),
        "fp32 oneDNN": lambda: ONEDNN(x, dense.weight, None, "none", [], ""),
        "bf16 RowLinear": lambda: routed(xb),
        "int8 (bf16 x)": lambda: int8(xb),
    }
    if w8a8_problem() is None:
        w8a8 = W8A8Linear(dense.weight, None)
        rows = quantize_rows(x)
        layouts["w8a8 (int8 x)"] = lambda: w8a8(x)
        layouts["w8a8, oneDNN's kernel alone"] = lambda: w8a8.quantized_product(*rows, x.dtype)
    print(f"\ncost per call apart from reading (a {k}x{n} product of one row), median us:")
    for label, call in layouts.items():
        for _ in range(10):
            call()
        seconds = []
        for _ in range(calls):
            started = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - started)
        print(f"{label:>28} {statistics.median(seconds) * 1e6:>8.1f}")


if __name__ == "__main__":
    run_script(main)
