"""Each decoder layer of a compiled step traced and compiled once, then reused for the rest.

Why: inductor compiled a decode step's whole stack as one graph, every layer
generated and built again as C++ (or Triton) of its own, per batch bucket
and attention span. A Qwen3-TTS 0.6B talker is 28 identical layers, and
its buckets 1-8 took 494 s to start with a cold cache on 2 cores. With the
layer a nested compile region (``torch.compiler.nested_compile_region``)
dynamo traces it and inductor builds it once per shape; each layer of the
stack calls that code with its own weights.

What it takes: the layer's graph must not depend on which layer it is, or
dynamo traces each layer again (reading nothing it must check per layer, it
traces one and stamps the others out). So the region gets the whole cache
and this layer's index as a tensor (a :class:`LayerSlotStore` over them; the
layer's own ``layer`` number goes unused), the operators that name an object
by a number take it as a tensor (:mod:`.graph_handles`), and fused
projections do not compare their members' ids while traced
(:mod:`.fused_linear`). Anything else that differs between layers (another
block type, another width) gets a body of its own, which is correct, only
slower to start.

Where: :func:`call_layer`, which a model's layer loop calls instead of the
layer. Outside a compiled trace, or over any store but a static step's
whose decoder asks for regions, it is the plain call.

What it gives (Qwen3-TTS 0.6B, buckets 1-8, 2 cores, bf16): ready in 75 s
with a cold inductor cache instead of 494, and 14 s with a warm one instead
of 32; the steps take the same time (the talker's 28 layers at one row,
alternated in one process: 25.9 against 26.0 ms; MOSS-TTS's width, 2
layers: 17.7 against 17.7 ms). ``OMNI_COMPILE_REGIONS=0`` compiles each step
as one graph, as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .static_kv import LayerSlotStore, StaticSlotStore
from .switches import switch_on


def call_layer(layer: Callable[..., Any], index: int, *args: Any, store: Any) -> Any:
    """``layer(*args, store)``: as a shared region where a compiled static step asks for one.

    ``index``: the layer's place in the cache (the number its attention
    passes to ``store.update``); ``args``: its inputs before the store.
    """
    if isinstance(store, StaticSlotStore) and store.regions and torch.compiler.is_compiling():
        return _layer_region(layer, *store.layer_inputs(index), store.span, *args)
    return layer(*args, store)


#: The environment variable that turns regions off (``0``); read when a decoder is built.
SWITCH = "OMNI_COMPILE_REGIONS"


def regions_wanted() -> bool:
    """Whether compiled steps should build each layer once (:data:`SWITCH` is not ``0``)."""
    return switch_on(SWITCH, "regions, the default")


#: How many traced shapes one region function may keep: one per step length of every
#: decoder whose layers it runs (the batch is an unbacked size and the attention span a
#: dynamic one: ``compiled.mark_rows_unbacked``), two where a step that reads its batch
#: falls back to a dynamic batch with bucket 1 apart; a prepacked step, whose sizes are
#: static, runs no regions. A model whose layers specialise the batch after all takes one
#: a bucket: Qwen3-TTS at buckets 1-8 then needs the talker's 4 and the code predictor's
#: 4 x 2. Torch's default, 8, had run out when each span was a shape of its own.
REGION_SHAPES = 256


@functools.partial(torch.compiler.nested_compile_region, max_reuse_entries=REGION_SHAPES)
def _layer_region(
    layer: Callable[..., Any],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer_id: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    span: int,
    *args: Any,
) -> Any:
    return layer(*args, LayerSlotStore(k_cache, v_cache, layer_id, slots, positions, span))
