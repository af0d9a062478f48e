"""The MOSS-TTS backbone split over ``tp_size`` ranks (``omni_core.engine.tp`` runs the group).

The backbone is Qwen3's decoder, split as the shared block splits
(:mod:`omni_qwen3_tts.tensor_parallel`: q/k/v and gate/up by columns, o_proj
and down by rows, KV heads divided among the ranks). Everything around it
stays on rank 0: the 33 channel embeddings (rank 0 embeds each step's ids),
the 33 heads and the delay pattern's sampling. Those read the final hidden
state, which every rank holds in full after the last all-reduce, so only
rank 0 needs them; the other ranks drop them and run only the decoder stack
on the embeddings rank 0 sends.

Rank 0's backbone forward is wrapped (:func:`mirror_backbone`) rather than
its caller changed: the step model calls the backbone as it always does,
and the wrapper first sends the call's inputs to the other ranks.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_core.engine.tp import Mirror, TPGroup
from omni_qwen3_tts.talker import SlotStore
from omni_qwen3_tts.tensor_parallel import check_divisible, shard_decoder_layer

from .config import MossTTSConfig, backbone_split_sizes


def shard_backbone(network: Any, cfg: MossTTSConfig, group: TPGroup) -> None:
    """Keep this rank's shard of ``network.language_model``, in place."""
    check_divisible(backbone_split_sizes(cfg), group.size, "the MOSS-TTS backbone")
    with torch.no_grad():
        for layer in network.language_model.layers:
            shard_decoder_layer(layer, group)
    if not group.leader:
        network.language_model.embed_tokens = None
        network.emb_ext = None
        network.lm_heads = None


def mirror_backbone(backbone: Any, mirror: Mirror) -> None:
    """Rank 0: every call of ``backbone`` first sends its inputs to the other ranks."""
    forward = backbone.forward

    def mirrored(x: Any, positions: Any, mask: Any, store: Any) -> Any:
        mirror.step([x, positions, mask, list(store.slots), list(store.starts), store.total])
        return forward(x, positions, mask, store)

    backbone.forward = mirrored


def follower_forward(backbone: Any):
    """What a follower runs for each of rank 0's passes."""

    def forward(cache: Any, value: list[Any]) -> None:
        x, positions, mask, slots, starts, total = value
        backbone(x, positions, mask, SlotStore(cache, slots, starts, total))

    return forward
