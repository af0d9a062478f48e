"""The talker's module tree (the release's ``talker.*`` with that prefix stripped).

``model`` is a decoder whose every layer is grouped-query attention (q/k
RMS norm, interleaved multimodal rotary positions) followed by a sparse
mixture of experts plus a *gated shared expert*: a dense SwiGLU every token
goes through, scaled by ``sigmoid(shared_expert_gate(x))``, added to the
routed mixture. ``model.codec_embedding`` embeds codebook-0 and control ids;
``codec_head`` scores codebook 0 from the final-normed hidden state.

Its input rows come from the thinker: ``text_projection`` maps the thinker's
layer-0 embeddings (text positions), ``hidden_projection`` its
``accept_hidden_layer`` states (image/audio/video positions), both two-layer
MLPs from the thinker's width to the talker's.

What is shared rather than rewritten: the attention, norms and decoder layer
(``omni_qwen3_tts.layers``; the talker passes its MoE as the layer's
``mlp``), the routed experts (the thinker's :class:`SparseMoE`, same routing
rules), and the whole code predictor (``omni_qwen3_tts.code_predictor``: the
Qwen3-Omni predictor is the same computation; with the predictor as wide as
the talker it has no input projection, so its tensors are exactly the
release's ``code_predictor.*``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from omni_qwen3_tts.code_predictor import CodePredictor
from omni_qwen3_tts.layers import DecoderLayer, DecoderStack, SwiGLU, mrope_cos_sin
from omni_qwen3_tts.talker import TextProjection

from ..thinker.moe import SparseMoE
from .config import TalkerConfig, TalkerTextConfig


class SharedExpertMoE(SparseMoE):
    """``mlp`` of a talker layer: routed experts plus a sigmoid-gated shared expert."""

    def __init__(self, cfg: TalkerTextConfig):
        super().__init__(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            cfg.norm_topk_prob,
        )
        self.shared_expert = SwiGLU(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed = super().forward(x)
        return routed + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class TalkerDecoder(DecoderStack):
    """``model``: the decoder layers (mixture-of-experts MLPs), the final norm and the
    codec embedding."""

    def __init__(self, cfg: TalkerTextConfig):
        moe = (DecoderLayer(cfg, i, mlp=SharedExpertMoE(cfg)) for i in range(cfg.num_hidden_layers))
        super().__init__(cfg, moe)
        self.cfg = cfg
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        store: Any = None,
    ) -> torch.Tensor:
        """Final-normed hidden states ``[B, T, H]`` of input rows ``x`` ``[B, T, H]``.

        ``positions`` ``[3, B, T]`` (temporal, height, width; ``[B, T]`` for
        equal streams). ``mask`` boolean ``[B, 1, T, S]`` over the ``S`` keys
        the store returns (None: causal within this call, or one new token
        that sees all cached keys).
        """
        if positions.dim() == 2:
            positions = positions[None].expand(3, *positions.shape)
        steps = x.shape[1]
        if mask is None and store is not None and steps > 1:
            raise ValueError("a KV store with several new tokens per row needs an explicit mask")
        if mask is None and steps > 1:
            mask = torch.ones(steps, steps, dtype=torch.bool, device=x.device).tril()
        cos, sin = mrope_cos_sin(positions, self.inv_freq, self.cfg.mrope_section, True, x.dtype)
        return self.run_layers(x, cos, sin, mask, store)


class Talker(nn.Module):
    """``talker``: decoder, the two thinker projections, ``codec_head`` and ``code_predictor``."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        text = cfg.text
        self.model = TalkerDecoder(text)
        # ``text_projection`` / ``hidden_projection``: thinker width -> talker width
        widths = (cfg.thinker_hidden_size, text.hidden_size, text.intermediate_size)
        self.text_projection = TextProjection(*widths)
        self.hidden_projection = TextProjection(*widths)
        self.codec_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.code_predictor, text.hidden_size)

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """Codec embeddings (codebook 0 and control / speaker ids) ``[..., H]``."""
        return self.model.codec_embedding(ids)

    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor:
        """The next input's codec part: the sum of a frame's G code embeddings.

        ``codes`` ``[B, G]`` -> ``[B, H]``. Codebook 0 through the talker's
        embedding, codebook g through the predictor's ``codec_embedding[g-1]``;
        summed in one reduction over the stacked rows, as the release does.
        """
        rows = [self.embed_codec(codes[:, 0])]
        tables = self.code_predictor.model.codec_embedding
        rows += [tables[g - 1](codes[:, g]) for g in range(1, codes.shape[1])]
        return torch.stack(rows, dim=1).sum(dim=1)

    def suppressed_ids(self, device: torch.device | str) -> torch.Tensor:
        """Codebook-0 ids never generated: the control range, EOS excepted."""
        start, stop = self.cfg.suppressed_range
        ids = torch.arange(start, stop, device=device)
        return ids[ids != self.cfg.codec_eos_token_id]

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        store: Any = None,
    ) -> torch.Tensor:
        """:meth:`TalkerDecoder.forward`: final-normed hidden states ``[B, T, H]``."""
        return self.model(x, positions, mask, store)
