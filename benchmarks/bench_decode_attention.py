"""A bf16 decode step's attention on this CPU, the three ways ``cpu_attention`` knows.

Run: ``python benchmarks/bench_decode_attention.py [--threads 2]`` (under a minute);
``--smoke``: two small shapes, seconds.

For the head layouts of the families' decoders (Qwen3-TTS talker and code predictor
16 query / 8 KV heads, MOSS-TTS 32 / 8, the Qwen3-Omni thinker 32 / 4 and its
talker 16 / 2, all of width 128) at 1 and 8 sequences and 64 to 16384 keys, the
milliseconds of one layer's attention for one new position per sequence:

* ``per head``: torch's fused kernel as the references call it (``enable_gqa``;
  ``OMNI_CPU_ATTENTION=fused``);
* ``products``: each KV head's query heads as the rows of two float32 products
  (``grouped_single_query``);
* ``rows``: the same grouping handed to the fused kernel as query rows
  (``fused_rows``);

and which of the last two ``grouped_decode`` (the default) takes. Each figure is the
fastest of ``--repeats`` timings of ``--calls`` calls.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from omni_core.engine import cpu_attention
from omni_core.sigterm import run_script

LAYOUTS = {"16/8": (16, 8), "32/8": (32, 8), "32/4": (32, 4), "16/2": (16, 2)}


def per_head(q, k, v, mask):  # type: ignore[no-untyped-def]
    """torch's fused kernel as the references call it."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


FORMS: tuple[Callable[..., object], ...] = (
    per_head,
    cpu_attention.grouped_single_query,
    cpu_attention.fused_rows,
)


def best_ms(call: Callable[..., object], inputs: tuple, calls: int, repeats: int) -> float:
    call(*inputs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call(*inputs)
        times.append((time.perf_counter() - start) / calls)
    return 1e3 * min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--calls", type=int, default=10, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=3, help="timings per figure")
    parser.add_argument("--smoke", action="store_true", help="two small shapes: checks it runs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layouts, batches, contexts = LAYOUTS, (1, 8), (64, 240, 1000, 4096, 16384)
    if args.smoke:
        layouts, batches, contexts = {"32/4": (32, 4)}, (2,), (64,)
        args.calls, args.repeats = 2, 1
    generator = torch.Generator().manual_seed(0)
    print(
        f"one layer's decode attention, bf16, {args.threads} torch thread(s), head width 128 "
        "(ms; fastest of the timings)"
    )
    print("heads  sequences   keys   per head   products     rows   default takes")
    for name, (heads, kv_heads) in layouts.items():
        for batch in batches:
            for keys in contexts:
                q = torch.randn(batch, heads, 1, 128, generator=generator).bfloat16()
                k = torch.randn(batch, kv_heads, keys, 128, generator=generator).bfloat16()
                v = torch.randn(batch, kv_heads, keys, 128, generator=generator).bfloat16()
                mask = torch.ones(batch, 1, 1, keys, dtype=torch.bool)
                inputs = (q, k, v, mask)
                figures = [best_ms(form, inputs, args.calls, args.repeats) for form in FORMS]
                default = cpu_attention.decode_form(batch, heads, kv_heads, keys)
                print(
                    f"{name:>5}  {batch:>9}  {keys:>5}  {figures[0]:>9.3f}  {figures[1]:>9.3f}  "
                    f"{figures[2]:>7.3f}   {default}"
                )
    return 0


if __name__ == "__main__":
    run_script(main)
