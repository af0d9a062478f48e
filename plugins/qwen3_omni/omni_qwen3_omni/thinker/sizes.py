"""What a thinker ``tp_size`` must divide (torch-free: the parent checks it when planning)."""

from __future__ import annotations

from ..config import TextConfig


def split_sizes(cfg: TextConfig) -> dict[str, int]:
    """Head counts and the MLP widths the split slices (see ``tensor_parallel``)."""
    sizes = {
        "attention heads": cfg.num_attention_heads,
        "KV heads": cfg.num_key_value_heads,
    }
    layers = range(cfg.num_hidden_layers)
    if any(cfg.is_moe_layer(i) for i in layers):
        sizes["moe_intermediate_size"] = cfg.moe_intermediate_size
    if not all(cfg.is_moe_layer(i) for i in layers):
        sizes["intermediate_size"] = cfg.intermediate_size
    return sizes
