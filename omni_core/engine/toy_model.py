"""A small, real decoder-only transformer that implements :class:`StepModel`.

It is the worked example of the engine contract, and what the engine's tests
and benchmark drive: token-id prompts, pre-norm attention blocks with
sinusoidal positions, keys and values kept in a :class:`SlotKVCache`, and the
shared sampler. Batched steps pad and mask, so a sequence's numbers do not
depend on its neighbours (up to float rounding).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..errors import RequestError
from .cpu_attention import attention
from .interface import CacheLayout, Sequence, StepResult
from .kv_cache import SlotKVCache
from .layer_regions import call_layer
from .sampling import sample_sequences


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embeddings ``[..., dim]`` of integer positions, for any position."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device) / half)
    angle = positions.unsqueeze(-1).float() * freq
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


def _rows(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layer`` over ``x`` ``[B, T, features]`` as one matrix of ``B * T`` rows: the same
    products and numbers.

    Why: inside a compiled step's layer region, torch's functorch decomposition of a
    linear layer with a bias reads a 3-D input's sizes as numbers, which an unbacked
    batch refuses and a dynamic one takes as a graph a bucket
    (``compiled.mark_rows_unbacked``); over 2-D rows it reads none.
    """
    return layer(x.flatten(0, 1)).unflatten(0, x.shape[:2])


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, index: int = 0):
        super().__init__()
        self.num_heads, self.head_dim, self.index = num_heads, dim // num_heads, index
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v ``[B, heads, T, head_dim]`` of ``x`` ``[B, T, dim]``."""
        batch, steps, _ = x.shape
        qkv = _rows(self.qkv, self.norm1(x)).view(batch, steps, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        return q, k, v

    def finish(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        attended = attention(q, k, v, mask)  # as every decoder does (cpu_attention)
        x = x + _rows(self.out, attended.transpose(1, 2).flatten(2))
        return x + _rows(self.mlp, self.norm2(x))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, store: Any) -> torch.Tensor:
        """The block over a KV store: its keys and values written at its ``index``."""
        q, k, v = self.heads(x)
        k_all, v_all = store.update(self.index, k, v)
        return self.finish(x, q, k_all, v_all, mask)


class TinyDecoder(nn.Module):
    """A seeded random decoder; prompts are lists of token ids, outputs are token ids."""

    def __init__(
        self,
        vocab_size: int = 64,
        dim: int = 32,
        num_heads: int = 2,
        num_layers: int = 1,
        *,
        eos_id: int | None = None,
        share_prefixes: bool = False,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.vocab_size, self.dim, self.eos_id = vocab_size, dim, eos_id
        self.share_prefixes = share_prefixes
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(Block(dim, num_heads, i) for i in range(num_layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab_size)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in self.named_parameters():  # every tensor from the seed
                if param.dim() > 1:
                    scale = param.shape[-1] ** -0.5
                    param.copy_(torch.randn(param.shape, generator=generator) * scale)
                elif name.endswith("bias"):
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
        self.to(device=device, dtype=dtype).eval()
        self.device, self.dtype = torch.device(device), dtype

    # -- StepModel -----------------------------------------------------------
    def cache_layout(self) -> CacheLayout:
        block = self.blocks[0]
        return CacheLayout(
            len(self.blocks), block.num_heads, block.head_dim, self.dtype, self.device
        )

    def prompt_length(self, prompt: Any) -> int:
        if not prompt:
            raise RequestError("the prompt is empty")
        if any(not 0 <= int(t) < self.vocab_size for t in prompt):
            raise RequestError(f"prompt token ids must be in [0, {self.vocab_size})")
        return len(prompt)

    def prefix_rows(self, seq: Sequence) -> torch.Tensor | None:
        """The ids (one per position), when built with ``share_prefixes``: the engine may
        then copy a prompt's head from another request's slot (engine/prefix_cache.py)."""
        if not self.share_prefixes:
            return None
        return torch.as_tensor(list(seq.prompt), dtype=torch.long)

    def generated_rows(self, seq: Sequence) -> torch.Tensor | None:
        """The generated ids fed back so far (the answer's positions in the cache), as
        ``prefix_rows`` gives a prompt's: a follow-up prompt may copy them too."""
        if not self.share_prefixes:
            return None
        fed = seq.cached - len(seq.prompt)
        return torch.as_tensor(seq.state.get("generated", [])[:fed], dtype=torch.long)

    def chunked_prefill(self, seq: Sequence) -> bool:
        """Every prompt may be prefilled over several steps (``seq.prefill_end``)."""
        return True

    def prefill(self, sequences: list[Sequence], cache: SlotKVCache) -> list[StepResult]:
        if any(seq.cached or seq.prefill_end is not None for seq in sequences):
            return self._extend(sequences, cache)
        lengths = torch.tensor([len(s.prompt) for s in sequences], device=self.device)
        steps = int(lengths.max())
        ids = torch.zeros(len(sequences), steps, dtype=torch.long, device=self.device)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq.prompt)] = torch.as_tensor(seq.prompt, device=self.device)
        positions = torch.arange(steps, device=self.device)
        x = self.embed(ids) + sinusoid(positions, self.dim).to(self.dtype)
        causal = positions.unsqueeze(1) >= positions.unsqueeze(0)  # [T, T]
        real = positions.unsqueeze(0) < lengths.unsqueeze(1)  # [B, T] keys inside the prompt
        mask = (causal.unsqueeze(0) & real.unsqueeze(1)).unsqueeze(1)
        slots = [s.slot for s in sequences]
        for index, block in enumerate(self.blocks):
            q, k, v = block.heads(x)
            cache.write(index, slots, [0] * len(sequences), k, v)
            x = block.finish(x, q, k, v, mask)
        last = x[torch.arange(len(sequences), device=self.device), lengths - 1]
        tokens = sample_sequences(self.head(self.norm(last)), sequences)
        for seq, length in zip(sequences, lengths.tolist(), strict=True):
            seq.cached = length
            seq.state["generated"] = []
        return self._results(sequences, tokens)

    def _extend(self, sequences: list[Sequence], cache: SlotKVCache) -> list[StepResult]:
        """A prefill whose first ``seq.cached`` positions are in the slot already, up to
        ``seq.prefill_end`` (a chunk: nothing is sampled for it)."""
        starts = [s.cached for s in sequences]
        news = [list(s.prompt)[s.cached : s.prefill_end] for s in sequences]
        lengths = torch.tensor([len(n) for n in news], device=self.device)
        steps = int(lengths.max())
        ids = torch.zeros(len(sequences), steps, dtype=torch.long, device=self.device)
        for row, new in enumerate(news):
            ids[row, : len(new)] = torch.as_tensor(new, device=self.device)
        begin = torch.tensor(starts, device=self.device)
        positions = begin[:, None] + torch.arange(steps, device=self.device)  # [B, T]
        x = self.embed(ids) + sinusoid(positions, self.dim).to(self.dtype)
        total = int((begin + lengths).max())
        keys = torch.arange(total, device=self.device)
        causal = keys[None, None, :] <= positions[:, :, None]  # [B, T, L]
        mask = (causal & (keys[None, :] < (begin + lengths)[:, None])[:, None, :]).unsqueeze(1)
        slots = [s.slot for s in sequences]
        for index, block in enumerate(self.blocks):
            q, k, v = block.heads(x)
            cache.write(index, slots, starts, k, v)
            k_all, v_all = cache.read(index, slots, total)
            x = block.finish(x, q, k_all, v_all, mask)
        for seq, length in zip(sequences, lengths.tolist(), strict=True):
            seq.cached += length
        done = [row for row, seq in enumerate(sequences) if seq.cached == len(seq.prompt)]
        results = [StepResult(output=None)] * len(sequences)
        if done:
            finished = [sequences[row] for row in done]
            rows = torch.tensor(done, device=self.device)
            last = x[rows, lengths[rows] - 1]
            for seq in finished:
                seq.state["generated"] = []
            tokens = sample_sequences(self.head(self.norm(last)), finished)
            for row, result in zip(done, self._results(finished, tokens), strict=True):
                results[row] = result
        return results

    def decode(self, sequences: list[Sequence], cache: SlotKVCache) -> list[StepResult]:
        starts = [s.cached for s in sequences]
        ids = torch.tensor([[s.state["generated"][-1]] for s in sequences], device=self.device)
        positions = torch.tensor(starts, device=self.device)
        x = self.embed(ids) + sinusoid(positions, self.dim).unsqueeze(1).to(self.dtype)
        length = max(starts) + 1
        slots = [s.slot for s in sequences]
        static = getattr(self, "static", None)
        hidden = None
        if static is not None and static.owns(cache.k) and static.fits(x):
            where = positions[:, None]
            slots_t = torch.tensor(slots, device=self.device)
            hidden = static(x, where, where, slots_t, longest=length)
        if hidden is None:
            keys = torch.arange(length, device=self.device)
            mask = (keys.unsqueeze(0) <= positions.unsqueeze(1))[:, None, None, :]  # [B,1,1,L]
            for index, block in enumerate(self.blocks):
                q, k, v = block.heads(x)
                cache.write(index, slots, starts, k, v)
                k_all, v_all = cache.read(index, slots, length)
                x = block.finish(x, q, k_all, v_all, mask)
            hidden = self.norm(x)
        logits = self.head(hidden[:, -1])
        tokens = sample_sequences(logits, sequences, [s.state["generated"] for s in sequences])
        for seq in sequences:
            seq.cached += 1
        return self._results(sequences, tokens)

    def prepare_static(self, context: Any) -> None:
        """The decode step the engine compiles (``engine.enable_torch_compile``)."""
        self.static = context.decoder("toy decoder", self.stack, hidden=self.dim, dtype=self.dtype)

    def stack(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, store: Any
    ) -> torch.Tensor:
        """The blocks and final norm over a KV store (positions are already in ``x``)."""
        for block in self.blocks:  # a compiled step builds one block for all (layer_regions)
            x = call_layer(block, block.index, x, mask, store=store)
        return self.norm(x)

    def _results(self, sequences: list[Sequence], tokens: torch.Tensor) -> list[StepResult]:
        results = []
        for seq, token in zip(sequences, tokens.tolist(), strict=True):
            seq.state["generated"].append(token)
            results.append(StepResult(output=token, finished=token == self.eos_id))
        return results
