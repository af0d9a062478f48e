"""Attention for one new position per sequence, on the CPU in bf16, with each KV head's query
heads taken together.

Why: a decode step asks attention for one query per sequence, and torch's
fused CPU kernel (``scaled_dot_product_attention``'s flash path) runs that
shape slowly in bf16, slower the more sequences and keys there are
(measured here, 2 threads, 16 query / 8 KV heads of 128: 389 us at one
sequence of 200 keys, 3011 us at eight of 200 and 15.2 ms at eight of
1000). Grouping each KV head's query heads into one matrix and multiplying
by the keys, then by the values, takes 117, 583 and 7127 us for the same
three: at eight sequences the Qwen3-TTS talker's 28 layers spent more time
in the fused kernel than in reading their weights.

Numerics: the products run in float32 over the bf16 queries, keys and
values (softmax and scale too), the output rounded to bf16 once. That is at
least as close to an exact computation as the fused kernel, which keeps
scores in float32 but rounds the probabilities to bf16 before the values
(largest difference from a float64 computation, measured on the shapes
above: equal to the fused kernel's, 0.005-0.008). Scores rounded to bf16
(transformers' ``eager`` form) were 3-6x further and put the Qwen3-Omni
talker's teacher-forced logits 5x outside the reference's own bf16 noise,
which is why the upcast is worth its copy of the keys and values. Float32,
other devices and several query positions (a prompt) keep the fused
kernel, which is fast and exact there.

The same grouping through the fused kernel (:func:`fused_rows`: each KV
head's query heads handed to it as that head's query rows) reads each key
once for the group and copies nothing to float32; with more than a little
work it is as fast or faster, and it keeps the kernel's numerics, the
references' own (:func:`grouped_decode` picks; 32 query / 4 KV heads, one
sequence of 16384 keys: 3.1 ms a layer against the products' 22.4, whose
float32 copies fall out of the caches; the products now take many long
sequences a few at a time, which brought 8 of 4096 keys from 46.9 to 6.4 ms
against the rows' 6.8; ``benchmarks/bench_decode_attention.py``).

Where it runs (``OMNI_CPU_ATTENTION``):

* ``auto`` (the default) and ``grouped``: the grouped forms in every bf16
  decode step on the CPU, eager and compiled. It is faster at every batch
  size and context measured (above), and it is what bf16 fidelity asks of
  us: within the references' own bf16 noise, not bit for bit (the bf16
  reference tests: teacher-forced logits and greedy picks wherever the
  reference's margin exceeds that noise). At 8 MOSS-TTS requests the fused
  kernel had taken 5.7 ms per layer of a 43 ms step (2 threads; 8 sequences
  of ~240 keys, 32 query / 8 KV heads), the grouped form 0.2 ms. A compiled
  step also attends over a static span of each slot
  (``compiled.attention_spans``) whose hidden keys the fused kernel computes
  all the same: eight sequences, 32 query / 4 KV heads, one thread, 64
  visible keys: fused 3.3 ms over 64 keys, 7.2 over a span of 135, 14.7 over
  270; grouped 0.28, 0.51, 0.94.
* ``fused``: torch's kernel everywhere, compiled steps too. The references
  run that kernel, and with it our eager bf16 decoders equal theirs bit for
  bit (the Qwen3-Omni talker's teacher-forced logits, 31 steps: 0.0 apart;
  with the grouped form 0.23 at one step, and a thinker token whose
  reference margin was 0.000 went the other way): for comparing outputs
  with a reference's exactly (the speech bf16 reference test's thinker).

A compiled step calls the grouped form through the operator
``omni::grouped_attention``, opaque to inductor, which runs it on the same
eager kernels: traced, inductor's own code for it ran 1.7-3.2x slower from
135 keys on (0.88 against 0.51 ms at 135, 3.05 against 0.94 at 270).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from .cuda_attention import grouped_prompt_inputs

MODE_VAR = "OMNI_CPU_ATTENTION"
MODES = ("auto", "fused", "grouped")

#: The fewest keys in a step (sequences x keys each) for which the grouped form is
#: taken: below it the fused kernel's single call beats the grouped form's several
#: (measured here: 60 against 83 us at one sequence of 16 keys, 403 against 100 at eight).
GROUPED_MIN_KEYS = 32


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, mask)`` with grouped heads, on the faster form.

    ``q`` ``[B, H, T, D]``, ``k``/``v`` ``[B, KV, S, D]`` (``H`` a multiple
    of ``KV``: query head ``h`` reads KV head ``h // (H / KV)``), ``mask``
    boolean ``[B, 1, T, S]`` (True = attend) or None; every query sees at
    least one key.
    """
    if q.shape[2] == 1 and q.dtype == torch.bfloat16 and q.is_cpu and attention_mode() != "fused":
        if torch.compiler.is_compiling():
            # the operator weighs the keys when it runs: a compiled step's batch may be an
            # unbacked size, on which a trace cannot branch (compiled.mark_rows_unbacked)
            return torch.ops.omni.grouped_attention(q, k, v, mask)
        if q.shape[0] * k.shape[2] >= GROUPED_MIN_KEYS:
            return grouped_decode(q, k, v, mask)
    if (
        mask is not None
        and q.shape[2] >= 2 * PREFILL_TILE
        and q.dtype in (torch.bfloat16, torch.float16)
        and q.is_cpu
        and not torch.compiler.is_compiling()
    ):
        return tiled_prefill(q, k, v, mask)
    if q.is_cuda and mask is not None:  # a prompt: keep it off the score-writing kernel
        k, v, grouped = grouped_prompt_inputs(q, k, v, mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )


#: Query positions per call of a long prefill's attention (:func:`tiled_prefill`).
PREFILL_TILE = 512


def tiled_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """A long prompt's attention, ``PREFILL_TILE`` queries at a time over the keys they see.

    Why: given a mask, torch's fused CPU kernel scores every query against
    every key, the causally hidden half included (it skips that half only for
    ``is_causal``, which cannot say where each row's prompt starts or ends).
    Cut into tiles of queries, each over the keys up to the last one its rows
    see, the hidden half is mostly not computed: 4096 positions, 32 query / 4
    KV heads of 128, bf16, 2 threads: 1.39 s a layer whole, 0.86 s in tiles of
    512. The dropped keys are hidden from every query of the tile, so the
    result is the same attention; the kernel blocks its work by key count, so
    a few outputs differ from the single call's by bf16 rounding (bit for bit
    in the case above; in the tests' ragged case 19 of 1.1M by one bf16 step,
    as close to the exact result as the single call's). Float32 keeps the
    single call, for the float32 reference tests, which compare bit for bit.
    """
    rows = q.shape[2]
    gqa = q.shape[1] != k.shape[1]
    out = torch.empty_like(q)
    for start in range(0, rows, PREFILL_TILE):
        stop = min(rows, start + PREFILL_TILE)
        # past the last key any query of the tile sees (every row sees key 0 at least)
        seen = mask[:, :, start:stop].any(dim=2).flatten(0, 1).any(dim=0)  # [S]
        end = int(seen.nonzero().max()) + 1
        out[:, :, start:stop] = F.scaled_dot_product_attention(
            q[:, :, start:stop],
            k[:, :, :end],
            v[:, :, :end],
            attn_mask=mask[:, :, start:stop, :end],
            enable_gqa=gqa,
        )
    return out


#: ``OMNI_CPU_ATTENTION`` as read at the first call (None: not read yet). A module
#: global rather than ``functools.cache``: a compiled step reads it as a constant,
#: where dynamo warns about tracing through a cache wrapper.
_mode: str | None = None


def attention_mode() -> str:
    """``OMNI_CPU_ATTENTION``: ``auto``, ``fused`` or ``grouped`` (read once per process)."""
    global _mode
    if _mode is None:
        value = os.environ.get(MODE_VAR, "auto").strip().lower() or "auto"
        if value not in MODES:
            raise ValueError(f"{MODE_VAR}={value!r}: use one of {', '.join(MODES)}")
        _mode = value
    return _mode


#: Above this many float32 bytes of keys (a chunk of sequences' ``[KV, S, D]``), the
#: grouped products take the sequences a few at a time: the float32 copies of all of
#: them fell out of the caches (8 sequences of 4096 keys, 8 KV heads of 128: 84.6 ms a
#: layer at once, 4.7 ms one sequence at a time).
GROUPED_CHUNK_BYTES = 8 << 20


def grouped_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """One query position per sequence, each KV head's query heads taken together.

    Two forms compute it. :func:`fused_rows` hands each KV head's query
    heads to torch's fused kernel as that head's query rows: the kernel then
    reads each key once for the group, with no float32 copy of the keys and
    values, and it wins or ties wherever there is more than a little work (32
    query / 4 KV heads of 128, 2 threads, one sequence of 16384 keys: 3.1 ms a
    layer against 22.4 for the products and 46.4 for the kernel per query
    head; 8 of 240: 0.31 against 0.36 and 5.32). :func:`grouped_single_query`'s two
    float32 products win where there is little work in groups of 2-4 (16 / 8
    heads, 8 sequences of 4-32 keys, a code predictor's: 80-99 against
    105-121 us) and where each KV head has one query head (the fused kernel's
    slow shape).
    """
    if decode_form(q.shape[0], q.shape[1], k.shape[1], k.shape[2]) == "rows":
        return fused_rows(q, k, v, mask)
    return grouped_single_query(q, k, v, mask)


def decode_form(batch: int, heads: int, kv_heads: int, keys: int) -> str:
    """Which form :func:`grouped_decode` takes: ``rows`` (:func:`fused_rows`) or
    ``products`` (:func:`grouped_single_query`), from the measured ranges above
    (``benchmarks/bench_decode_attention.py`` prints them for every layout)."""
    group = heads // kv_heads
    if group >= 2 and (group >= 8 or batch == 1 or batch * keys > 512):
        return "rows"
    return "products"


def fused_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Each KV head's query heads as the query rows of one fused-kernel call.

    The kernel's numerics, those the references run (scores in float32,
    probabilities rounded to bf16 before the values), for every row: the
    output equals the per-head call's within a bf16 rounding (the kernel
    blocks its work by the rows it is given; often bit for bit).
    """
    batch, heads, _, head_dim = q.shape
    kv_heads = k.shape[1]
    rows = q.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    # a [B, 1, 1, S] mask broadcasts over KV heads and their query rows
    out = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask)
    return out.reshape(batch, heads, 1, head_dim)


def grouped_single_query(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """One query position per sequence: each KV head's query heads as the rows of one
    product, in float32 (a few sequences at a time where their keys are many)."""
    batch, heads, _, head_dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    step = max(1, GROUPED_CHUNK_BYTES // (kv_heads * keys * head_dim * 4))
    if batch > step:
        parts = [
            grouped_single_query(
                q[at : at + step],
                k[at : at + step],
                v[at : at + step],
                mask if mask is None or mask.shape[0] == 1 else mask[at : at + step],
            )
            for at in range(0, batch, step)
        ]
        return torch.cat(parts)
    rows = q.reshape(batch, kv_heads, heads // kv_heads, head_dim).float()
    scores = torch.matmul(rows, k.float().transpose(-1, -2))  # [B, KV, G, S]
    if mask is not None:
        # [B, 1, 1, S] broadcasts over KV heads and their groups
        scores = torch.where(mask, scores, float("-inf"))
    weights = torch.softmax(scores.mul_(head_dim**-0.5), dim=-1)
    out = torch.matmul(weights, v.float())
    return out.to(q.dtype).view(batch, heads, 1, head_dim)


def _grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    if q.shape[0] * k.shape[2] < GROUPED_MIN_KEYS:  # as attention() decides eagerly
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
        )
    return grouped_decode(q, k, v, mask)  # looked up per call: tests may count calls


def _grouped_attention_shape(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    return q.new_empty(q.shape)


# torch.library.Library, as omni::blocked_linear (cpu_blocked_weight.py): no per-call wrapper.
_LIBRARY = torch.library.Library("omni", "FRAGMENT")
_LIBRARY.define("grouped_attention(Tensor q, Tensor k, Tensor v, Tensor? mask) -> Tensor")
_LIBRARY.impl("grouped_attention", _grouped_attention, "CPU")
torch.library.register_fake("omni::grouped_attention", _grouped_attention_shape, lib=_LIBRARY)
