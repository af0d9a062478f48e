"""The thinker's feed-forward blocks: a sparse mixture of SwiGLU experts, and the dense MLP.

Routing follows the release: a bias-free linear router (``mlp.gate``) scores
every expert, the scores go through a float32 softmax, the ``top_k`` largest
are kept and, when ``norm_topk_prob`` is set, rescaled to sum to one, then cast
back to the activation dtype. Each token's output is the weighted sum of its
chosen experts' outputs. Experts stay one module each
(``mlp.experts.E.{gate,up,down}_proj``), because that is how the release's
checkpoint stores them, so tensors load by name without reshaping.

Why the computation is grouped by expert: every (token, expert) assignment is
sorted by expert once per call; each expert that received tokens then runs
once, on all of its tokens as one matrix, and scatters its weighted rows back
with ``index_add_``. An expert's weights are read from memory once per call
however many tokens chose it, and the Python loop runs over touched experts,
never over tokens.

What that costs at decoding batch sizes (measured on the CPU, one torch
thread, float32, hidden 2048, 128 experts, moe_intermediate 768, top-8, random
router weights; milliseconds per MoE layer, median):

====== ======== =============== ======================
tokens grouped  experts touched gather + bmm (see below)
====== ======== =============== ======================
1      15.6     8               115
4      60.5     30              461
8      94.7     51              995
32     254      112             --
====== ======== =============== ======================

Decoding is bound by reading expert weights (8 experts x 3 matrices x 1.5 M
values = 150 MB per layer per token at float32, ~10 GB/s here): the cost
tracks the number of touched experts, which grows sub-linearly with the batch
(a random router spreads 8 tokens over ~51 of 128 experts), so batching
decodes still pays. The per-expert Python and small-op overhead is about
0.1 ms per touched expert (measured with tiny experts), a few percent of the
total.

The alternative considered for tiny batches was to gather the k chosen
experts' weight matrices per token (from stacked ``[E, I, H]`` tensors) and
run one batched matmul. It is 7-10x slower on the CPU: gathering copies the
same bytes the grouped path only reads, and the grouped path already reads
each chosen matrix exactly once; it would also need the experts stored
stacked, unlike the checkpoint. So the grouped path serves every batch size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_qwen3_tts.layers import SwiGLU

from ..config import TextConfig


class SparseMoE(nn.Module):
    """``mlp`` of a sparse thinker layer: router ``gate`` and ``experts`` (one SwiGLU each)."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        num_experts: int,
        top_k: int,
        norm_topk_prob: bool = True,
    ):
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k ({top_k}) must be in 1..num_experts ({num_experts})")
        self.num_experts, self.top_k, self.norm_topk_prob = num_experts, top_k, norm_topk_prob
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(hidden, intermediate) for _ in range(num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Routing weights (``x.dtype``) and expert indexes, both ``[N, k]``, of ``x`` ``[N, H]``.

        The softmax runs in float32 whatever the activation dtype: in bfloat16
        the top-k choice among 128 close scores would otherwise flip.
        """
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    # Routing reads expert counts on the host: a compiled decode step runs it eagerly
    # (one clean graph break) instead of recompiling for every count.
    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., H]`` -> same shape: the routed mixture of expert outputs."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, experts = self.route(flat)
        out = torch.zeros_like(flat)
        assigned = experts.reshape(-1)  # pair p = token * k + slot
        order = assigned.argsort(stable=True)
        counts = torch.bincount(assigned, minlength=self.num_experts).tolist()
        pair_weights = weights.reshape(-1)
        start = 0
        # Ascending expert order, as the release accumulates: the float sums
        # per token then happen in the same order.
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            pairs = order[start : start + count]
            start += count
            tokens = pairs // self.top_k
            rows = self.experts[expert](flat.index_select(0, tokens))
            out.index_add_(0, tokens, rows * pair_weights.index_select(0, pairs)[:, None])
        return out.view(shape)


def make_mlp(cfg: TextConfig, layer: int) -> nn.Module:
    """The feed-forward block of decoder layer ``layer``: sparse experts or the dense SwiGLU.

    Which one follows the config (``mlp_only_layers``, ``decoder_sparse_step``,
    ``num_experts``); the dense one is ``intermediate_size`` wide.
    """
    if cfg.is_moe_layer(layer):
        return SparseMoE(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            cfg.norm_topk_prob,
        )
    return SwiGLU(cfg.hidden_size, cfg.intermediate_size)
