"""Tensor-parallel shards of the Qwen3 decoder block (:mod:`.layers`), in place.

The block is shared by the Qwen3-Omni thinker and the MOSS-TTS backbone, so
its split lives here, next to it. Attention is split by whole heads: rank
``r`` of ``N`` keeps query heads ``r*h/N .. (r+1)*h/N`` and the key/value
heads they read (GQA groups stay on one rank, because the KV heads split
the same way), with ``o_proj`` row-parallel. The SwiGLU splits ``gate``/
``up`` by columns and ``down`` by rows. One all-reduce after attention and
one after the MLP per layer; norms, rotary tables and residuals are
replicated. The forward code is unchanged: only modules and head counts are.
"""

from __future__ import annotations

from typing import Any

from omni_core.engine.tp import RowParallelLinear, TPGroup, split_columns

from .layers import Attention, DecoderLayer, SwiGLU


def check_divisible(sizes: dict[str, int], tp_size: int, where: str) -> None:
    """ValueError naming each size the split cannot divide (what the plan checks too)."""
    bad = [f"{name} {value}" for name, value in sizes.items() if value % tp_size]
    if bad:
        raise ValueError(
            f"{where}: tp_size {tp_size} does not divide {', '.join(bad)}; each rank must hold "
            "whole heads and equal slices"
        )


def shard_attention(attn: Attention, group: TPGroup) -> None:
    rank, size = group.rank, group.size
    check_divisible({"attention heads": attn.heads, "KV heads": attn.kv_heads}, size, "attention")
    attn.q_proj = split_columns(attn.q_proj, rank, size, "q_proj")
    attn.k_proj = split_columns(attn.k_proj, rank, size, "k_proj")
    attn.v_proj = split_columns(attn.v_proj, rank, size, "v_proj")
    attn.o_proj = RowParallelLinear(attn.o_proj, group, "o_proj")  # type: ignore[assignment]
    attn.heads //= size
    attn.kv_heads //= size


def shard_swiglu(mlp: SwiGLU, group: TPGroup) -> None:
    rank, size = group.rank, group.size
    mlp.gate_proj = split_columns(mlp.gate_proj, rank, size, "gate_proj")
    mlp.up_proj = split_columns(mlp.up_proj, rank, size, "up_proj")
    mlp.down_proj = RowParallelLinear(mlp.down_proj, group, "down_proj")  # type: ignore[assignment]


def shard_decoder_layer(layer: DecoderLayer, group: TPGroup, mlp: Any = None) -> None:
    """Attention always; the MLP when it is the dense SwiGLU (else the caller's ``mlp``)."""
    shard_attention(layer.self_attn, group)
    if isinstance(layer.mlp, SwiGLU):
        shard_swiglu(layer.mlp, group)
    elif mlp is not None:
        mlp(layer, group)
    else:
        raise TypeError(f"no tensor-parallel split for a {type(layer.mlp).__name__} MLP")
