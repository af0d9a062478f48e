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

from omni_core.engine.cpu_linear import row_linear
from omni_qwen3_tts.layers import DecoderStack

from .config import MossTTSConfig


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
        weights = self._audio_head_weights()  # [Q, 1025, H]
        books = books if books is not None else range(weights.shape[0])
        rows = weights[books.start : books.stop].flatten(0, 1)  # a view: no copy
        # one [B, H] x [H, n * 1025] product: a single GEMM streams the heads once for
        # the whole batch (32 small products cost ~4x more at 8 rows), through the
        # faster bf16 kernels on the CPU (row_linear, RowLinear's routes)
        logits = row_linear(hidden, rows).view(hidden.shape[0], len(books), -1)
        logits[..., self.cfg.audio_pad_code] = float("-inf")
        return logits

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
