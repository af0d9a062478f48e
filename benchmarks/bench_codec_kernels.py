"""A codec chunk's float32 products on the CPU: MKL vs oneDNN, GELU as a post-op, one product.

Run: ``python benchmarks/bench_codec_kernels.py [--threads 2]`` (about half a
minute; ``--smoke``: tiny shapes, one pass, a few seconds).

Why: the vocoder stages decode a chunk of tens to thousands of rows at a
time, where a product is bound by arithmetic, not by reading its weight, and
on some CPUs MKL's float32 kernel (``torch.mm`` / ``F.linear``) runs such
shapes at half oneDNN's speed whatever the weight's size (a 2-core AMD EPYC:
about 220 against 490 GFLOP/s). So the vocoder stages route every float32
decoder layer of theirs to oneDNN (``PackedLinear``; ``factory.pack_weights``),
apply a GELU that follows one as the product's post-op
(``cpu_linear.linear_gelu``) and send a transposed convolution computed as one
product to oneDNN too (``cpu_linear.float32_matmul``). This script prints each
of the three at the MOSS-TTS codec's and the Qwen3-TTS decoder's shapes, so a
machine where MKL is the faster can be seen to be one:

1. ``F.linear`` (MKL) against ``PackedLinear`` (oneDNN), GFLOP/s;
2. ``F.gelu`` after the routed product against ``linear_gelu``, ms, and
   whether the two are equal bit for bit;
3. ``torch.mm`` against ``float32_matmul`` for ``[rows, in] x [in, out * kernel]``.

Each figure is the best of five passes after a warm-up, on the process's
compute thread with ``--threads`` torch threads, as a stage process runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.compute import call_on_compute_thread, dedicate
from omni_core.engine.cpu_kernel_choice import best_time
from omni_core.engine.cpu_linear import (
    PackedLinear,
    float32_matmul,
    linear_gelu,
    packing_available,
)
from omni_core.sigterm import run_script

#: (label, in, out, a GELU follows): the MOSS-TTS codec decoder's layers and the Qwen3-TTS
#: decoder's ConvNeXt MLP
LINEARS = (
    ("MOSS attention out 768x768", 768, 768, False),
    ("MOSS MLP in 768->3072", 768, 3072, True),
    ("MOSS stage-1 MLP in 1280->5120", 1280, 5120, True),
    ("Qwen3-TTS ConvNeXt 1024->4096", 1024, 4096, True),
)
#: (label, in, out * kernel): Qwen3-TTS's first two upsampling layers as one product each
TRANSPOSED = (("upsample 1536 -> 768 x 16", 1536, 12288), ("upsample 768 -> 384 x 10", 768, 3840))
ROWS = (64, 256, 1024)
SMOKE_LINEARS = (("tiny 64->256", 64, 256, True),)
SMOKE_TRANSPOSED = (("tiny 64 -> 32 x 4", 64, 128),)
SMOKE_ROWS = (8, 32)


def best_ms(run: Callable[[], object], passes: int) -> float:
    """The fastest of ``passes`` calls after an untimed one, in milliseconds."""
    return best_time(run, repeats=passes) * 1e3


def print_linears(shapes: tuple, rows: tuple[int, ...], passes: int) -> None:
    print("\n1. float32 F.linear (MKL) against PackedLinear (oneDNN), GFLOP/s:")
    print(f"{'layer':>32} {'rows':>5} {'MKL':>8} {'oneDNN':>8} {'speed-up':>9}")
    for label, fan_in, fan_out, _ in shapes:
        dense = nn.Linear(fan_in, fan_out, bias=False)
        routed = PackedLinear(dense)
        for n in rows:
            x = torch.randn(n, fan_in)
            flops = 2 * n * fan_in * fan_out / 1e9
            mkl = best_ms(lambda: F.linear(x, dense.weight), passes)  # noqa: B023
            onednn = best_ms(lambda: routed(x), passes)  # noqa: B023
            print(
                f"{label:>32} {n:>5} {flops / mkl * 1e3:>8.0f} {flops / onednn * 1e3:>8.0f} "
                f"{mkl / onednn:>8.2f}x"
            )


def print_gelu(shapes: tuple, rows: tuple[int, ...], passes: int) -> None:
    print("\n2. F.gelu after the routed product against linear_gelu (the GELU as its post-op), ms:")
    print(f"{'layer':>32} {'rows':>5} {'then gelu':>10} {'post-op':>8} {'equal':>6}")
    for label, fan_in, fan_out, feeds_gelu in shapes:
        if not feeds_gelu:
            continue
        routed = PackedLinear(nn.Linear(fan_in, fan_out))
        for n in rows:
            x = torch.randn(n, fan_in) * 3
            apart = best_ms(lambda: F.gelu(routed(x)), passes)  # noqa: B023
            fused = best_ms(lambda: linear_gelu(routed, x), passes)  # noqa: B023
            equal = torch.equal(F.gelu(routed(x)), linear_gelu(routed, x))
            print(f"{label:>32} {n:>5} {apart:>10.2f} {fused:>8.2f} {'yes' if equal else 'NO':>6}")


def print_transposed(shapes: tuple, rows: tuple[int, ...], passes: int) -> None:
    print("\n3. a transposed convolution's product [rows, in] x [in, out * kernel], ms:")
    print(f"{'layer':>32} {'rows':>5} {'torch.mm':>9} {'float32_matmul':>15} {'speed-up':>9}")
    for label, fan_in, columns in shapes:
        weight = torch.randn(fan_in, columns)
        for n in rows:
            x = torch.randn(n, fan_in)
            mkl = best_ms(lambda: torch.mm(x, weight), passes)  # noqa: B023
            onednn = best_ms(lambda: float32_matmul(x, weight), passes)  # noqa: B023
            print(f"{label:>32} {n:>5} {mkl:>9.2f} {onednn:>15.2f} {mkl / onednn:>8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes, one pass: checks the script runs"
    )
    args = parser.parse_args()
    if not packing_available():
        print("this torch build has no oneDNN linear kernel: every product stays on torch.mm")
        return
    torch.set_num_threads(args.threads)
    dedicate(args.threads)  # what a stage process does once built (engine/compute.py)
    linears = SMOKE_LINEARS if args.smoke else LINEARS
    transposed = SMOKE_TRANSPOSED if args.smoke else TRANSPOSED
    rows = SMOKE_ROWS if args.smoke else ROWS
    passes = 1 if args.smoke else 5
    print(f"float32 products at a codec chunk's rows, {args.threads} thread(s), best of {passes}")

    def run() -> None:
        with torch.inference_mode():
            print_linears(linears, rows, passes)
            print_gelu(linears, rows, passes)
            print_transposed(transposed, rows, passes)

    call_on_compute_thread(run)


if __name__ == "__main__":
    run_script(main)
