"""The other few-row kernels torch ships, beside the routes the CPU stages take.

Run: ``python benchmarks/bench_cpu_kernel_survey.py [--threads 1] [--layers 40]``
(about a minute; ``--smoke``: two layers, one and two rows, one pass, seconds).

Why: a decode step on the CPU is bound by how fast its products stream
weights, and the stages' bf16 route (oneDNN's inner product over weights
reordered to its blocked layout, ``BlockedLinear``) reads them at roughly
half to two thirds of what a plain ``sum`` reads on one thread. Issue 29
asks for well-kept kernels rather than hand-written ones, so the question is
whether torch already ships a faster one. This script times every candidate
on the same weights and prints how far each one's answers stray, so that the
choice can be checked again on another machine or another torch:

* **bf16 blocked**: the stages' route (``factory.dtype = "bfloat16"``), with
  this machine's padding of a lone row (``cpu_kernel_choice``).
* **int8 weight-only**: ``Int8Linear``, ``aten._weight_int8pack_mm``, the
  route ``factory.quantization = "int8"`` takes.
* **fbgemm fp16**: ``quantized::linear_dynamic_fp16``. bf16 weights held as
  float16 (exact for every value in float16's normal range), float32
  activations: the same products as bf16's up to summation order. What
  ``factory.fp16_row_weights`` takes for one or two rows, beside the blocked
  weight (``omni_core.engine.cpu_row_copy``).
* **oneDNN W8A8**: ``onednn::qlinear_pointwise`` (what torch's x86 PT2E
  quantization lowers to), int8 weights per channel and activations
  quantised per row here, before the call.
* **fbgemm W8A8**: ``quantized::linear_dynamic``. Its own activation scale is
  one per call; each row is divided by its largest magnitude first and a
  fixed row ``[1, -1, 0 ...]`` appended, so that the call's scale never
  depends on the other rows (a batch of requests answers as each alone).

W8A8 also rounds the activations, so the accuracy table matters as much as
the times: its inputs are random, and the same with one channel 30 times
the others (the outlier channels of real transformer activations).
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.cpu_blocked_weight import blocking_available
from omni_core.engine.cpu_kernel_choice import best_time, kernel_choice
from omni_core.engine.cpu_linear import BlockedLinear, use_routes
from omni_core.engine.quantize import Int8Linear
from omni_core.sigterm import run_script

#: Decode-time shapes, ``in -> out``: the Qwen3-Omni thinker's expert (hidden 2048,
#: moe_intermediate 768, gate/up fused) and Qwen3-TTS 0.6B's fused q/k/v.
SHAPES = {
    "expert gate/up 2048->1536": (2048, 1536),
    "expert down 768->2048": (768, 2048),
    "talker q/k/v 1024->4096": (1024, 4096),
}
ROWS = (1, 2, 4, 8, 64, 256)  # decode batches, then prefill-sized products
OUTLIER = 30.0  # one input channel this many times the others (the accuracy table's second input)

Kernel = Callable[[torch.Tensor], torch.Tensor]


def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def onednn_int8_available() -> bool:
    return hasattr(torch.ops.onednn, "qlinear_pointwise")


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 ``[out, in]`` and float32 scales ``max|w| / 127``, as ``Int8Linear`` does."""
    w32 = weight.float()
    scales = w32.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return torch.round(w32 / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


def rows_to_unit(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 rows divided by their largest magnitude, and those magnitudes ``[M, 1]``."""
    flat = x.float()
    scale = flat.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
    return flat / scale, scale


def fp16_kernel(weight: torch.Tensor) -> Kernel:
    packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x.float(), packed).to(x.dtype)

    return run


def onednn_w8a8_kernel(weight: torch.Tensor) -> Kernel:
    q, scales = int8_per_channel(weight)
    packed = torch.ops.onednn.qlinear_prepack(q, None)
    zeros = torch.zeros(q.shape[0], dtype=torch.long)

    def run(x: torch.Tensor) -> torch.Tensor:
        unit, row_scale = rows_to_unit(x)
        # per row to int8, then shifted to uint8 with zero point 128: x86's u8 x s8 products
        shifted = (torch.round(unit * 127.0) + 128.0).to(torch.uint8)
        out = torch.ops.onednn.qlinear_pointwise(
            shifted, 1.0 / 127.0, 128, packed, scales, zeros, None, 1.0, 0,
            torch.float32, "none", [], "",
        )  # fmt: skip
        return (out * row_scale).to(x.dtype)

    return run


def fbgemm_w8a8_kernel(weight: torch.Tensor) -> Kernel:
    q, scales = int8_per_channel(weight)
    with warnings.catch_warnings():
        # torch marks its quantized tensor type for removal; this torch still packs with it
        warnings.simplefilter("ignore")
        quantized = torch._make_per_channel_quantized_tensor(
            q, scales.double(), torch.zeros(q.shape[0], dtype=torch.long), 0
        )
    packed = torch.ops.quantized.linear_prepack(quantized, None)
    fixed = torch.zeros(1, q.shape[1])
    fixed[0, 0], fixed[0, 1] = 1.0, -1.0  # the call's range is [-1, 1] whatever the rows

    def run(x: torch.Tensor) -> torch.Tensor:
        unit, row_scale = rows_to_unit(x)
        out = torch.ops.quantized.linear_dynamic(torch.cat((unit, fixed)), packed, False)
        return (out[: unit.shape[0]] * row_scale).to(x.dtype)

    return run


def kernels(weight: torch.Tensor) -> dict[str, tuple[Kernel, int]]:
    """Each available kernel over bf16 ``weight``, and the bytes per weight it reads."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=torch.bfloat16)
    layer.weight.data = weight
    found: dict[str, tuple[Kernel, int]] = {}
    if blocking_available():
        found["bf16 blocked"] = (BlockedLinear.of(weight, None), 2)
    else:
        found["bf16 F.linear"] = (lambda x: F.linear(x, weight), 2)
    found["int8 weight-only"] = (Int8Linear(layer), 1)
    if fbgemm_available():
        found["fbgemm fp16"] = (fp16_kernel(weight), 2)
    if onednn_int8_available():
        found["oneDNN W8A8"] = (onednn_w8a8_kernel(weight), 1)
    if fbgemm_available():
        found["fbgemm W8A8"] = (fbgemm_w8a8_kernel(weight), 1)
    return found


def relative_error(kernel: Kernel, weight: torch.Tensor, x: torch.Tensor) -> float:
    """``|kernel(x) - x W^T| / |x W^T|`` against the float64 product of the same bf16 values."""
    exact = x.double() @ weight.double().t()
    return float((kernel(x).double() - exact).norm() / exact.norm())


def read_bandwidth(megabytes: int, passes: int) -> float:
    """GB/s a plain ``sum`` reads from a buffer far beyond the caches."""
    big = torch.ones(megabytes * 1024 * 1024 // 4)
    seconds = best_time(big.sum, repeats=passes)
    return megabytes / 1e3 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the thinker's: 1)")
    parser.add_argument("--layers", type=int, default=40, help="distinct weights per shape")
    parser.add_argument(
        "--smoke", action="store_true", help="two layers, one pass: checks the script runs"
    )
    args = parser.parse_args()
    rows, passes, read_mb = ROWS, 5, 512
    if args.smoke:
        args.layers, rows, passes, read_mb = 2, ROWS[:2], 1, 16
    torch.set_num_threads(args.threads)
    use_routes(kernel_choice())  # the padding this machine's stages give a lone row
    print(
        f"{args.threads} torch thread(s); memory read bandwidth (sum over {read_mb} MB): "
        f"{read_bandwidth(read_mb, passes):.1f} GB/s"
    )
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for label, (k, n) in SHAPES.items():
            weights = [
                (torch.randn(n, k, generator=generator) * 0.02).to(torch.bfloat16)
                for _ in range(args.layers)
            ]
            built = [kernels(w) for w in weights]
            names = list(built[0])
            print(f"\n{label}, {args.layers} weights: ms per weight (weight GB/s of its own bytes)")
            print(f"{'rows':>5} " + " ".join(f"{name:>20}" for name in names))
            for count in rows:
                x = torch.randn(count, k, generator=generator).to(torch.bfloat16)
                cells = []
                for name in names:
                    size = built[0][name][1]
                    calls = [b[name][0] for b in built]
                    seconds = best_time(lambda c=calls, x=x: [f(x) for f in c], repeats=passes)
                    seconds /= len(calls)
                    gbs = n * k * size / seconds / 1e9
                    cells.append(f"{seconds * 1e3:.3f} ({gbs:4.1f})")
                print(f"{count:>5} " + " ".join(f"{c:>20}" for c in cells))
            plain = torch.randn(8, k, generator=generator).to(torch.bfloat16)
            spiky = plain.clone()
            spiky[:, 0] *= OUTLIER
            print("  relative error against the float64 product, 8 rows (plain; one outlier):")
            for name in names:
                kernel = built[0][name][0]
                errors = [relative_error(kernel, weights[0], x) for x in (plain, spiky)]
                print(f"    {name:>20}: {errors[0]:.2e}; {errors[1]:.2e}")


if __name__ == "__main__":
    run_script(main)
