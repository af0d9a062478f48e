"""The thinker split over ``tp_size`` ranks (``omni_core.engine.tp`` runs the group).

Attention and the dense MLP split as the shared Qwen3 block does
(:mod:`omni_qwen3_tts.tensor_parallel`): q/k/v and gate/up by columns,
o_proj and down by rows, KV heads divided among the ranks.

The mixture of experts: each expert's FFN is split like the dense MLP (its
gate/up by columns, its down by rows), not the experts among the ranks.
Why: decoding reads the chosen experts' weights at every step, and the step
ends when the slowest rank does. With every expert split, each rank reads
exactly ``1/N`` of every chosen expert, whatever the router picks; with
experts divided among ranks (expert parallel), a token whose top-8 land on
one rank's experts makes that rank read all of them while the others wait,
and the per-step time is the worst rank's. Both need one all-reduce per MoE
layer (the experts' partial outputs are summed locally, in the release's
ascending expert order, and reduced once, see :class:`AllReduceOutput`), the
router stays replicated (every rank routes the same tokens identically: the
hidden states entering it are equal after the attention's all-reduce), and
the checkpoint's per-expert layout loads unchanged. Each rank's shards are
stacked again at its first step (``expert_stack``), so every rank runs its
experts as grouped products. ``moe_intermediate_size`` must divide by
``tp_size``.

Rank 0 keeps the embeddings and the language-model head (it embeds the
prompt and samples); the other ranks drop them, since they only ever run the
decoder stack on embeddings rank 0 sends.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_core.engine.tp import AllReduceOutput, TPGroup, split_columns, split_rows
from omni_qwen3_tts.layers import DecoderLayer
from omni_qwen3_tts.talker import SlotStore
from omni_qwen3_tts.tensor_parallel import check_divisible, shard_decoder_layer

from ..config import TextConfig
from .moe import SparseMoE
from .sizes import split_sizes


def _shard_moe(layer: DecoderLayer, group: TPGroup) -> None:
    moe = layer.mlp
    if not isinstance(moe, SparseMoE):
        raise TypeError(f"no tensor-parallel split for a {type(moe).__name__} MLP")
    rank, size = group.rank, group.size
    for expert in moe.experts:
        expert.gate_proj = split_columns(expert.gate_proj, rank, size, "expert gate_proj")
        expert.up_proj = split_columns(expert.up_proj, rank, size, "expert up_proj")
        expert.down_proj = split_rows(expert.down_proj, rank, size, "expert down_proj")
    layer.mlp = AllReduceOutput(moe, group)


def shard_thinker(lm: Any, cfg: TextConfig, group: TPGroup) -> None:
    """Keep this rank's shard of ``lm`` (a ``ThinkerLM``), in place."""
    check_divisible(split_sizes(cfg), group.size, "the thinker")
    with torch.no_grad():
        for layer in lm.model.layers:
            shard_decoder_layer(layer, group, mlp=_shard_moe)
    if not group.leader:
        lm.model.embed_tokens = None
        lm.lm_head = None


def follower_forward(lm: Any):
    """What a follower runs for each of rank 0's passes (see ``ThinkerStepModel._forward``)."""

    def forward(cache: Any, value: list[Any]) -> None:
        x, positions, mask, slots, starts, total, deepstack = value
        lm(x, positions, mask, SlotStore(cache, slots, starts, total), deepstack=deepstack)

    return forward
