"""The thinker's text decoder (``thinker.model``) and language-model head (``thinker.lm_head``).

A Qwen3-MoE stack: pre-norm layers of grouped-query attention (per-head q/k
RMS norm, interleaved multimodal rotary positions) and a sparse expert block
(or a dense SwiGLU on ``mlp_only_layers``). Module names mirror the release's
``thinker.`` subtree, so with that prefix stripped the checkpoint loads by name
into :class:`ThinkerLM` (``model.*``, ``lm_head.*``).

The forward works on embeddings, not ids: the caller has already put the
audio and image encoders' outputs at their placeholder positions (see
:meth:`ThinkerLM.embed`). Keys and values go through a ``KVStore`` (the
engine's slot cache via ``SlotStore``, or any object with ``update``), so one
forward serves prefill, chunked prefill and batched decoding.

Deepstack: the vision encoder also returns features from some of its inner
blocks (three in the release). The release adds feature set ``i`` to the
output of decoder layer ``i`` at the visual-token positions, for ``i`` below
the number of sets, i.e. after layers 0, 1 and 2. That is what
``deepstack`` does here.

Rotary positions are always interleaved: the release's thinker builds its
tables that way and does not read the config's ``interleaved`` flag.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import overload

import torch
from torch import nn

from omni_core.engine.layer_regions import call_layer
from omni_qwen3_tts.layers import DecoderLayer, KVStore, RMSNorm, mrope_cos_sin, register_rope

from ..config import TextConfig
from .moe import make_mlp

#: One deepstack set: flat indexes ``b * T + t`` of the visual tokens in this
#: call, and the features ``[n, H]`` to add there (row ``j`` at ``index[j]``).
DeepstackSet = tuple[torch.Tensor, torch.Tensor]


class ThinkerTextModel(nn.Module):
    """``model``: token embeddings, the decoder layers and the final norm."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            # Qwen3's block (shared with Qwen3-TTS), the feed-forward a mixture of experts
            DecoderLayer(cfg, i, mlp=make_mlp(cfg, i))  # type: ignore[arg-type]
            for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        register_rope(self, cfg.head_dim, cfg.rope_theta)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos/sin ``[B, T, head_dim]`` of positions ``[3, B, T]`` (``[B, T]``: equal streams)."""
        if positions.dim() == 2:
            positions = positions[None].expand(3, *positions.shape)
        return mrope_cos_sin(positions, self.inv_freq, self.cfg.mrope_section, True, dtype)

    @overload
    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = ...,
        store: KVStore | None = ...,
        deepstack: Sequence[DeepstackSet] | None = ...,
        capture_layers: None = ...,
    ) -> torch.Tensor: ...

    @overload
    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = ...,
        store: KVStore | None = ...,
        deepstack: Sequence[DeepstackSet] | None = ...,
        *,
        capture_layers: Collection[int],
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]: ...

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        store: KVStore | None = None,
        deepstack: Sequence[DeepstackSet] | None = None,
        capture_layers: Collection[int] | None = None,
    ):
        """Run the stack; returns the final-normed hidden states ``[B, T, H]``.

        ``positions`` ``[3, B, T]`` int64 (temporal, height, width streams;
        see ``positions.py``). ``mask`` boolean ``[B, 1, T, S]`` (True =
        attend) over the ``S`` keys the store returns; ``None`` means causal
        within this call, which is right without a store or for a single new
        token per row (it then sees every cached key), and is refused
        otherwise. ``deepstack[i]`` is added after layer ``i``.

        ``capture_layers`` uses the release's ``hidden_states`` numbering
        (what the talker's ``accept_hidden_layer`` counts in): 0 is the input
        embeddings, ``k`` the output of layer ``k - 1`` (after its deepstack
        addition, as the release records it in place), ``num_hidden_layers``
        the final-normed output. With it the result is ``(hidden, {k: [B, T, H]})``.
        """
        steps = inputs_embeds.shape[1]
        if mask is None and store is not None and steps > 1:
            raise ValueError("a KV store with several new tokens per row needs an explicit mask")
        if mask is None and steps > 1:
            mask = torch.ones(steps, steps, dtype=torch.bool, device=inputs_embeds.device).tril()
        if deepstack is not None and len(deepstack) > len(self.layers):
            raise ValueError(f"{len(deepstack)} deepstack sets for {len(self.layers)} layers")
        wanted = set(capture_layers) if capture_layers is not None else set()
        bad = [k for k in wanted if not 0 <= k <= len(self.layers)]
        if bad:
            raise ValueError(f"capture_layers {sorted(bad)} outside 0..{len(self.layers)}")
        captured: dict[int, torch.Tensor] = {}
        cos, sin = self.rotary(positions, inputs_embeds.dtype)
        x = inputs_embeds
        if 0 in wanted:
            captured[0] = x
        for i, layer in enumerate(self.layers):
            # one compiled layer serves them all in a compiled step (layer_regions)
            x = call_layer(layer, layer.self_attn.layer, x, cos, sin, mask, store=store)
            if deepstack is not None and i < len(deepstack):
                x = add_at(x, *deepstack[i])
            if i + 1 in wanted and i + 1 < len(self.layers):
                captured[i + 1] = x
        x = self.norm(x)
        if capture_layers is None:
            return x
        if len(self.layers) in wanted:
            captured[len(self.layers)] = x
        return x, captured


def add_at(hidden: torch.Tensor, index: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``hidden`` ``[B, T, H]`` with ``features[j]`` added at flat position ``index[j]`` (b*T+t).

    Out of place (``index_add``), so a tensor captured before stays as it was.
    Each visual position gets exactly one addition, in the activation dtype,
    as the release's masked add does.
    """
    batch, steps, width = hidden.shape
    if features.shape != (index.numel(), width):
        raise ValueError(
            f"deepstack features {tuple(features.shape)} do not match {index.numel()} positions "
            f"of width {width}"
        )
    flat = hidden.reshape(batch * steps, width)
    flat = flat.index_add(0, index.to(flat.device), features.to(flat.device, flat.dtype))
    return flat.view(batch, steps, width)


def flat_positions(mask: torch.Tensor) -> torch.Tensor:
    """Flat indexes ``b * T + t`` of the True entries of ``mask`` ``[B, T]``, in row-major order.

    That is the order the release pairs visual features with visual tokens
    (boolean-mask indexing), so features gathered per sequence in prompt
    order line up with these indexes.
    """
    return mask.reshape(-1).nonzero().squeeze(1)


class ThinkerLM(nn.Module):
    """The thinker's text half: ``model`` (decoder) and ``lm_head`` (no bias)."""

    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.cfg = cfg
        self.model = ThinkerTextModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[..., H]`` (placeholders get overwritten by encoder outputs)."""
        return self.model.embed_tokens(ids)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        store: KVStore | None = None,
        deepstack: Sequence[DeepstackSet] | None = None,
        capture_layers: Collection[int] | None = None,
    ):
        """:meth:`ThinkerTextModel.forward`: final-normed hidden ``[B, T, H]`` (and captures)."""
        return self.model(inputs_embeds, positions, mask, store, deepstack, capture_layers)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits ``[..., vocab]`` of final-normed hidden states."""
        return self.lm_head(hidden)
