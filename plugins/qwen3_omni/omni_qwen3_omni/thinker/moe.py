"""The thinker's feed-forward blocks: a sparse mixture of SwiGLU experts, and the dense MLP.

Routing follows the release: a bias-free linear router (``mlp.gate``) scores
every expert, the scores go through a float32 softmax, the ``top_k`` largest
are kept and, when ``norm_topk_prob`` is set, rescaled to sum to one, then cast
back to the activation dtype. Each token's output is the weighted sum of its
chosen experts' outputs. Experts stay one module each
(``mlp.experts.E.{gate,up,down}_proj``), because that is how the release's
checkpoint stores them, so tensors load by name without reshaping; their
weights are views of two stacked tensors (:mod:`.expert_stack`).

Why the computation is grouped by expert: every (token, expert) pair is
sorted by expert once per call, and each expert that received tokens runs
once, on all of its tokens as one matrix. An expert's weights are read from
memory once per call however many tokens chose it. Two ways run that:

* **stacked** (the default): ``torch.nn.functional.grouped_mm`` over the
  stacked weights, with each expert's group delimited by offsets computed on
  the device. Nothing is read on the host, so on a GPU whose grouped kernel
  is fused a decode step holding these layers is captured as a CUDA graph
  (``expert_stack.graph_capturable``); on the CPU torch loops over the
  groups in C++, and results equal the loop's bit for bit, bfloat16 too:
  outputs are summed in the release's order and roundings.
* **looped**: a Python loop over touched experts, reading the per-expert
  counts on the host (one device synchronisation per layer). It serves the
  experts that are not plain layers (int8, the CPU's bf16 ``RowLinear``
  where its one-row route is this machine's faster kernel, and bf16 weights
  blocked for oneDNN where that route is: :func:`block_mixtures`, which then
  run past their modules, :mod:`.blocked_experts`), widths whose
  rows are not a multiple of 16 bytes, a leader's shared weights laid out
  unstacked, and GPUs or dtypes where
  torch's grouped kernel is not fused (it would read offsets on the host).
  A compiled step calls it through the operator ``omni::looped_mixture``
  (:mod:`.looped_op`), so the loop is one opaque node in the step's graph
  rather than a graph break in every sparse layer.

What they cost at decoding batch sizes (measured on the CPU, one torch
thread, hidden 2048, 128 experts, moe_intermediate 768, top-8, random router
weights; milliseconds per MoE layer, median of 7, both in one run; outputs
equal bit for bit):

====== =============== =============== ===============
tokens float32 looped  bf16 looped     experts touched
       / stacked       / stacked
====== =============== =============== ===============
1      11.5 / 10.5     8.9 / 8.2       8
4      41.9 / 38.4     32.1 / 28.0     30
8      75.2 / 68.0     57.9 / 50.8     51
32     178.3 / 161.8   129.5 / 115.9   112
====== =============== =============== ===============

Decoding is bound by reading expert weights (8 experts x 3 matrices x 1.5 M
values = 150 MB per layer per token at float32): the cost tracks the number
of touched experts, which grows sub-linearly with the batch (a random router
spreads 8 tokens over ~51 of 128 experts), so batching decodes still pays.

Gathering each token's k expert matrices out of the stack and running one
batched product was measured too and rejected: 7-10x slower on the CPU, as
the gather copies the very bytes a grouped product only reads.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.cpu_linear import BlockedLinear, BlockedRows
from omni_core.engine.heap import return_freed_memory
from omni_qwen3_tts.layers import SwiGLU

from ..config import TextConfig
from . import blocked_experts, w8a8_experts
from .blocked_experts import blocked_floor
from .expert_stack import (
    STACK_CHECK,
    ensure_stacked,
    graph_capturable,
    grouped_product_runs,
    lies_stacked,
    may_copy,
    stack_experts,
    stackable,
    stacked_views,
)
from .looped_op import register_mixture
from .w8a8_experts import w8a8_ready


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
        # what a compiled step names this mixture by when its experts loop (looped_op.py):
        # tensor `handle`
        register_mixture(self)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        register_mixture(self)  # a copy (deepcopy, pickle) is another mixture

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

    def uses_stack(self) -> bool:
        """Whether this call runs the grouped product over stacked experts (:mod:`.expert_stack`).

        Outside a compiled trace this looks at the experts (two address reads
        when nothing changed) and stacks them if they may be; inside one it
        keeps the answer found before tracing (:func:`stack_mixtures`).
        """
        gate = self.experts[0].gate_proj
        if isinstance(gate, (BlockedLinear, BlockedRows)):
            return False  # blocked for oneDNN (block_mixtures); its .weight would be a copy
        # A weight that is a parameter, not a property: int8 layers (Int8Linear,
        # W8A8Linear) answer .weight with a dequantised copy, a millisecond per call.
        weight = gate._parameters.get("weight")
        if weight is None:
            return False
        tracing = torch.compiler.is_compiling()
        if not grouped_product_runs(weight.device, weight.dtype, tracing):
            return False
        if tracing:
            check = self.__dict__.get(STACK_CHECK)
            return check is not None and check.stacked
        return ensure_stacked(self, self.experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., H]`` -> same shape: the routed mixture of expert outputs."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if self.uses_stack():
            return self._stacked(flat).view(shape)
        return self._looped(flat).view(shape)

    def _stacked(self, flat: torch.Tensor) -> torch.Tensor:
        """Every (token, expert) pair in three grouped products, with nothing read on the host.

        Pairs are sorted by expert (stably, so each expert's tokens keep
        their order) and each expert's group ends where ``searchsorted``
        says, on the device; the outputs are summed as the release sums
        them (:func:`sum_in_expert_order`), so on the CPU the results equal
        :meth:`_looped`'s bit for bit wherever the elementwise kernels meet
        no SIMD tail in either (expert widths such as the release's 768;
        an odd tiny width differs in the last bit).
        """
        weights, experts = self.route(flat)
        pairs = experts.reshape(-1)  # pair p = token * k + slot
        by_expert, order = pairs.sort(stable=True)
        ids = torch.arange(self.num_experts, device=flat.device, dtype=by_expert.dtype)
        ends = torch.searchsorted(by_expert, ids, right=True).to(torch.int32)
        tokens = order // self.top_k
        gate_up, down = stacked_views(self.experts)
        inner = down.shape[-1]
        picked = flat.index_select(0, tokens)
        # gate and up as two products, as the per-expert layers compute them: one
        # product over both would pick other kernels and round float32 differently
        gate = F.grouped_mm(picked, gate_up[:, :inner].transpose(1, 2), offs=ends)
        up = F.grouped_mm(picked, gate_up[:, inner:].transpose(1, 2), offs=ends)
        hidden = F.silu(gate) * up
        outputs = F.grouped_mm(hidden, down.transpose(1, 2), offs=ends)
        weighted = outputs * weights.reshape(-1).index_select(0, order)[:, None]
        return sum_in_expert_order(weighted, order, experts)

    def _looped(self, flat: torch.Tensor) -> torch.Tensor:
        """One product per touched expert: experts that cannot be stacked (int8 layers,
        widths the grouped product refuses, a leader's unstacked shared weights)."""
        weights, experts = self.route(flat)
        if torch.compiler.is_compiling():
            # The loop reads expert counts on the host: in a compiled graph the router is
            # traced and the loop is one opaque operator (looped_op.py), which runs it
            # eagerly. (Not torch.compiler.disable on _loop: that decorator imports dynamo
            # when this module loads, 1.4 s in every stage process that imports it.)
            return torch.ops.omni.looped_mixture(flat, weights, experts, self.handle)
        return self._loop(flat, weights, experts)

    def _loop(
        self, flat: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`_looped` after routing: ``weights`` and ``experts`` ``[N, k]``.

        Every pair's token is gathered once, in expert order, so each expert
        reads a slice of one matrix; the weighting and the release's sum
        (:func:`sum_in_expert_order`, ascending expert per token) then run
        once over all pairs, as the stacked path's do. The same numbers as a
        gather, weighting and ``index_add_`` per expert (each token meets an
        expert at most once, so each add rounds alike), with half the small
        operations per expert: 5-6 % less time per release-width mixture at
        8 and 16 tokens (blocked bf16, one thread: 33.95 -> 32.06 ms and
        56.01 -> 52.73 at 8 and 16 tokens).
        """
        run = self._expert_rows()  # blocked or w8a8_int8 experts, past their modules
        if flat.shape[0] == 1:
            out = torch.zeros_like(flat)
            if run is not None:
                chosen = experts[0].tolist()
                return blocked_experts.one_token(run, self.experts, flat, weights[0], chosen, out)
            return self._one_token(flat, weights[0], experts[0], out)
        pairs = experts.reshape(-1)  # pair p = token * k + slot
        order = pairs.argsort(stable=True)
        counts = torch.bincount(pairs, minlength=self.num_experts).tolist()
        picked = flat.index_select(0, order // self.top_k)
        if run is not None:
            outputs = blocked_experts.grouped_rows(run, self.experts, picked, counts)
        else:
            outputs = torch.empty_like(picked)
            start = 0
            for expert, count in enumerate(counts):
                if count:
                    end = start + count
                    outputs[start:end] = self.experts[expert](picked[start:end])
                    start = end
        weighted = outputs * weights.reshape(-1).index_select(0, order)[:, None]
        return sum_in_expert_order(weighted, order, experts)

    def _expert_rows(self) -> blocked_experts.ExpertRows | None:
        """How these experts run past their modules, or None (through them): blocked for
        oneDNN (:mod:`.blocked_experts`) or w8a8_int8 (:mod:`.w8a8_experts`)."""
        floor = blocked_floor(self.experts)
        if floor is not None:
            return functools.partial(blocked_experts.expert_rows, floor=floor)
        return w8a8_experts.expert_rows if w8a8_ready(self.experts) else None

    def _one_token(
        self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, out: torch.Tensor
    ) -> torch.Tensor:
        """A lone token (a single request's decode step): its experts on ``x`` itself, no
        gather or scatter. The same products, weighting and ascending-expert sum as the
        loop's, so the same numbers bit for bit; the gathers and scatters cost about a
        sixth of a release-width mixture's time at one token on the CPU (5.6 against
        4.7 ms for the products alone, one thread)."""
        chosen = experts.tolist()
        for slot in sorted(range(len(chosen)), key=chosen.__getitem__):
            out += self.experts[chosen[slot]](x) * weights[slot]
        return out


def sum_in_expert_order(
    weighted: torch.Tensor, order: torch.Tensor, experts: torch.Tensor
) -> torch.Tensor:
    """Each token's ``k`` weighted expert outputs summed as the release sums them.

    ``weighted`` ``[N * k, H]``: row ``i`` belongs to pair ``order[i]``
    (token ``p // k``, slot ``p % k``); ``experts`` ``[N, k]``: each pair's
    expert. The release adds a token's outputs one expert at a time in
    ascending expert order, rounding after each add; a single ``index_add_``
    over all pairs would not (in bfloat16 it accumulates duplicate rows more
    precisely on the CPU, and by atomics in no fixed order on a GPU). So the
    rows are taken token by token, each token's in expert order, with one
    row gather, and ``k`` plain adds run: the same roundings in every dtype,
    the same result every run, nothing read on the host. (A scatter back to
    pair order and a gather over ``[N, k, H]`` with an expanded index did the
    same and took 0.38 s of a 2.1 s release-width layer's prefill of 4096
    tokens, bf16, 2 threads; the row gather takes 0.03 s.)
    """
    top_k, width = experts.shape[-1], weighted.shape[-1]
    where = torch.empty_like(order)  # the row of ``weighted`` that holds each pair
    where[order] = torch.arange(order.shape[0], device=order.device, dtype=order.dtype)
    ranks = experts.argsort(dim=-1, stable=True)
    rows = where.view(-1, top_k).gather(1, ranks)  # each token's rows, in expert order
    ordered = weighted.index_select(0, rows.reshape(-1)).view(-1, top_k, width)
    total = ordered[:, 0]
    for slot in range(1, top_k):
        total = total + ordered[:, slot]
    return total


def stack_mixtures(module: nn.Module, *, copy: bool = True) -> tuple[int, int]:
    """Stack the experts of every mixture in ``module`` that can be; (stacked, mixtures).

    ``copy=False`` (a module just built, its weights not yet filled) lays
    out the stacks without touching their memory. Step models call it
    before compiling or capturing, so that a trace sees the stacked path.
    """
    stacked = total = 0
    for sub in module.modules():
        if not isinstance(sub, SparseMoE):
            continue
        total += 1
        if not copy and stackable(sub.experts) and not lies_stacked(sub.experts):
            stack_experts(sub.experts, copy=False)
        stacked += sub.uses_stack()
    return stacked, total


def block_mixtures(module: nn.Module) -> int:
    """Give every CPU bf16 mixture's experts weights blocked for oneDNN; how many layers.

    Only where this machine's routes take blocked bf16 weights
    (``omni_core.engine.cpu_kernel_choice``): there the looped experts
    stream their weights faster than the grouped product over the stack
    (measured on a 2-core AMD EPYC, one thread, release width, two layers:
    18.3 -> 10.4 ms at one token, 109.9 -> 67.7 ms at eight). Each expert's
    gate/up become one blocked product (``BlockedRows``), its down a
    ``BlockedLinear``, all copies, and the stack they were
    views of is freed once a mixture is done (one mixture's experts of
    extra memory at the peak). Never a leader's shared weights or a
    follower's mapped ones (``may_copy``): a copy per process would undo
    weight sharing.
    """
    from omni_core.engine import cpu_linear

    if not (cpu_linear.routes().bf16_blocked and cpu_linear.blocking_available()):
        return 0
    blocked = 0
    for sub in module.modules():
        if not isinstance(sub, SparseMoE):
            continue
        first = sub.experts[0].gate_proj
        if type(first) not in (nn.Linear, cpu_linear.RowLinear):
            continue
        weight = first.weight
        if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
            continue
        if not may_copy(sub.experts):
            continue
        for expert in sub.experts:
            # gate/up as one product: 0.80-0.85 of the time of two at one and two rows
            # (128 experts at release width, padded products, one or two threads)
            cpu_linear.block_as_one(expert, ("gate_proj", "up_proj"))
            expert.down_proj = BlockedLinear(expert.down_proj)
            blocked += 3
        sub.__dict__.pop(STACK_CHECK, None)
    if blocked:
        return_freed_memory()
    return blocked


def mixtures_capturable(module: nn.Module, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether every mixture in ``module`` runs without a host read, so that a step
    holding them can be captured as a CUDA graph (stacks them first)."""
    stacked, total = stack_mixtures(module)
    return stacked == total and (total == 0 or graph_capturable(device, dtype))


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
