"""The MOSS-TTS network: a Qwen3 decoder read and written through 33 channels.

Each sequence position carries 33 ids: a text token and one code per audio
codebook. The input embedding of a position is the sum of the text
embedding and the 32 codebook embeddings (``emb_ext.k``, 1024 codes plus the
pad). Every head reads the same final-normed hidden state: ``lm_heads.0``
scores the text vocabulary, ``lm_heads.1..32`` score each codebook's 1025
entries. Module names mirror the release (``language_model.*``,
``emb_ext.*``, ``lm_heads.*``) so its checkpoint loads by name.
"""

from __future__ import annotations

import torch
from torch import nn

from omni_core.engine.cpu_blocked_weight import blocked_product
from omni_core.engine.cpu_linear import routes, row_linear
from omni_qwen3_tts.layers import DecoderStack

from .config import MossTTSConfig

#: Where the audio heads' blocked weights are kept once blocked (a plain attribute,
#: read at every step without going through the module list).
BLOCKED_HEADS = "_blocked_audio_heads"


class Backbone(DecoderStack):
    """``language_model``: Qwen3's token embedding, decoder layers and final norm."""

    def __init__(self, cfg: MossTTSConfig):
        t = cfg.backbone
        super().__init__(t)
        self.embed_tokens = nn.Embedding(t.vocab_size, t.hidden_size)


class MossNetwork(nn.Module):
    """The checkpoint's module tree: backbone, 32 codebook embeddings, 33 heads."""

    def __init__(self, cfg: MossTTSConfig):
        super().__init__()
        self.cfg = cfg
        hidden = cfg.backbone.hidden_size
        self.language_model = Backbone(cfg)
        self.emb_ext = nn.ModuleList(
            nn.Embedding(cfg.audio_vocab_size + 1, hidden) for _ in range(cfg.n_vq)
        )
        self.lm_heads = nn.ModuleList([nn.Linear(hidden, cfg.backbone.vocab_size, bias=False)])
        self.lm_heads.extend(
            nn.Linear(hidden, cfg.audio_vocab_size + 1, bias=False) for _ in range(cfg.n_vq)
        )

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Ids ``[..., 33]`` -> the summed embedding ``[..., H]`` of each position."""
        out = self.language_model.embed_tokens(ids[..., 0])
        for k, table in enumerate(self.emb_ext):
            out = out + table(ids[..., k + 1])
        return out

    def text_logits(self, hidden: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Text-head logits ``[B, V]`` of hidden states ``[B, H]`` (only columns ``ids`` if given).

        Inside audio the release masks every text id but two (gen slot and
        delay slot), so scoring those two rows of the head gives the same
        choice at a 75000th of the cost of the full vocabulary at 8B.
        """
        weight = self.lm_heads[0].weight
        if ids is not None:
            weight = weight[ids]
        return row_linear(hidden, weight)

    def audio_logits(self, hidden: torch.Tensor, books: range | None = None) -> torch.Tensor:
        """Codebook logits ``[B, len(books), 1025]`` (all books by default), pad entry at -inf.

        ``books`` is a contiguous range: at the start of a segment only the
        first few codebooks are due and in the drain only the last few, and
        the heads are read from memory at every step, so scoring only the due
        ones saves what they would cost (about a third of a step at 8B width).
        """
        blocked = self.__dict__.get(BLOCKED_HEADS)
        if blocked is not None:  # block_audio_heads: one blocked product per due head
            books = books if books is not None else range(len(blocked))
            pad = routes().bf16_blocked_min_rows  # a lone request's row padded where that pays
            logits = torch.stack([blocked_product(hidden, blocked[b], None, pad) for b in books], 1)
        else:
            weights = self._audio_head_weights()  # [Q, 1025, H]
            books = books if books is not None else range(weights.shape[0])
            rows = weights[books.start : books.stop].flatten(0, 1)  # a view: no copy
            # one [B, H] x [H, n * 1025] product: a single GEMM streams the heads once for
            # the whole batch (32 small products cost ~4x more at 8 rows), through the
            # faster bf16 kernels on the CPU (row_linear, RowLinear's routes)
            logits = row_linear(hidden, rows).view(hidden.shape[0], len(books), -1)
        logits[..., self.cfg.audio_pad_code] = float("-inf")
        return logits

    def block_audio_heads(self) -> int:
        """Hold the audio heads blocked for oneDNN where this machine's routes say so; how many.

        Why: the heads (268 MB of bf16 at 8B width) are read at every step.
        Measured on a 2-core AMD EPYC whose routes take blocked weights: the
        32 heads as one dense product 17.4 ms at one row and 18.0 at eight,
        one blocked product per head 11.5 and 14.1, and a step scores only
        its due heads (at a segment's start and drain, a few), which one
        product per head keeps. Each head becomes a ``BlockedLinear`` copy
        (the dense stack is freed; the heads leave ``state_dict``); never
        heads shared with or mapped from another process (a copy each would
        undo weight sharing), never float32 ones.
        """
        from omni_core.engine import cpu_linear, mapped

        heads = list(self.lm_heads[1:]) if self.lm_heads is not None else []
        if not heads or BLOCKED_HEADS in self.__dict__:
            return 0
        if not (cpu_linear.routes().bf16_blocked and cpu_linear.blocking_available()):
            return 0
        weights = [head.weight for head in heads if type(head) is nn.Linear]
        if len(weights) != len(heads) or any(
            w.dtype != torch.bfloat16
            or w.device.type != "cpu"
            or w.is_shared()
            or mapped.is_mapped(w)
            for w in weights
        ):
            return 0
        del weights
        for index in range(1, len(self.lm_heads)):
            self.lm_heads[index] = cpu_linear.BlockedLinear(self.lm_heads[index])
        self.__dict__.pop("_stacked_heads", None)
        self.__dict__[BLOCKED_HEADS] = [head.packed for head in self.lm_heads[1:]]
        return len(heads)

    def _audio_head_weights(self) -> torch.Tensor:
        """The 32 audio heads as one ``[Q, 1025, H]`` tensor, for one batched matmul per step.

        Stacked once; each head's parameter then becomes a view into the
        stack, so the weights are held once and ``state_dict`` is unchanged.
        """
        heads = [head.weight for head in self.lm_heads[1:]]
        stacked = getattr(self, "_stacked_heads", None)
        if stacked is None or heads[0].data_ptr() != stacked.data_ptr():
            with torch.no_grad():
                stacked = torch.stack([h.detach() for h in heads])
                for k, head in enumerate(heads):
                    head.data = stacked[k]
            self._stacked_heads = stacked
        return stacked
