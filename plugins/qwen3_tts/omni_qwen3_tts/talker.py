"""The talker: a Qwen3 decoder over summed text and codec embeddings that emits codebook 0.

Module names follow the release (``talker.model.layers.N...``,
``talker.text_projection``, ``talker.codec_head``, ``talker.code_predictor``)
so the checkpoint loads by name. Positions are the release's M-RoPE with three
equal streams (speech has no image grid); keys and values go to the engine's
slot cache through :class:`SlotStore`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.sampling import from_host

from .code_predictor import CodePredictor
from .config import TalkerConfig
from .layers import DecoderStack, mrope_cos_sin, rope_cos_sin


class SlotStore:
    """Adapts the engine's ``SlotKVCache`` to the attention layers of one batched step."""

    def __init__(self, cache: Any, slots: list[int], starts: list[int], total: int):
        self.cache, self.slots, self.starts, self.total = cache, slots, starts, total

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.cache.write(layer, self.slots, self.starts, k, v)
        return self.cache.read(layer, self.slots, self.total)


def forward_rows(
    stack: Any,
    static: Any,
    sequences: list[Any],
    embeds: list[torch.Tensor],
    cache: Any,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Run a decoder ``stack`` on each sequence's new embeddings; return each row's last state.

    Rows are ragged (a prompt's many positions beside a decode step's one) and
    each writes its own cache slot from its own start. A batch of single steps
    that the compiled ``static`` step (or None) owns and fits goes through it.
    Shared by every family built on the Qwen3 stack (Qwen3-TTS's talker,
    MOSS-TTS's backbone).
    """
    from .layers import causal_mask

    lengths = [int(e.shape[0]) for e in embeds]
    steps, hidden = max(lengths), int(embeds[0].shape[-1])
    x = torch.zeros(len(embeds), steps, hidden, dtype=dtype, device=device)
    for row, e in enumerate(embeds):
        x[row, : e.shape[0]] = e
    starts = [int(seq.cached) for seq in sequences]
    starts_t = from_host(starts, device)
    lengths_t = from_host(lengths, device)
    total = max(s + n for s, n in zip(starts, lengths, strict=True))
    positions = starts_t[:, None] + torch.arange(steps, device=device)[None]
    out = None
    if static is not None and steps == 1 and static.owns(cache.k) and static.fits(x):
        slots = from_host([int(seq.slot) for seq in sequences], device)
        out = static(x, positions, positions, slots, longest=total)
    if out is None:
        mask = causal_mask(starts_t, lengths_t, steps, total)
        store = SlotStore(cache, [int(seq.slot) for seq in sequences], starts, total)
        out = stack(x, positions, mask, store)
    for seq, n in zip(sequences, lengths, strict=True):
        seq.cached += n
    return out[torch.arange(len(embeds), device=device), lengths_t - 1]


def complete_frames(
    talker: Any,
    hidden: torch.Tensor,
    code0: torch.Tensor,
    eos: int,
    rows: list[Any],
    generators: list[torch.Generator],
) -> tuple[list[int], list[int], torch.Tensor | None]:
    """Each row's whole frame once its codebook-0 code is chosen (both talkers' step).

    Returns the codebook-0 ids (one device sync for the batch), the rows that
    go on (code not ``eos``) and their frames ``[len(go), G]`` on the device:
    the code predictor (``talker.code_predictor``, sampling each row with
    ``rows[i]``) adds codebooks 1..G-1 after codebook 0. None when none goes on.
    """
    ids = code0.tolist()
    go = [i for i, code in enumerate(ids) if code != eos]
    if not go:
        return ids, go, None
    index = from_host(go, hidden.device)
    rest = talker.code_predictor.generate_frame(
        hidden[index],
        talker.embed_codec(code0[index]),
        [rows[i] for i in go],
        [generators[i] for i in go],
    )
    return ids, go, torch.cat([code0[index, None], rest], dim=1)


class TextProjection(nn.Module):
    """Two-layer MLP (SiLU between) mapping text rows to the talker width: Qwen3-TTS's
    text embeddings (``inner`` = their width) and Qwen3-Omni's thinker rows."""

    def __init__(self, text_hidden: int, hidden: int, inner: int | None = None):
        super().__init__()
        inner = inner or text_hidden
        self.linear_fc1 = nn.Linear(text_hidden, inner, bias=True)
        self.linear_fc2 = nn.Linear(inner, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(DecoderStack):
    """``talker.model``: layers, final norm, codec (codebook 0 + control) and text embeddings."""

    def __init__(self, cfg: TalkerConfig):
        t = cfg.transformer
        super().__init__(t)
        self.cfg = cfg
        self.codec_embedding = nn.Embedding(t.vocab_size, t.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos/sin for positions ``[B, T]`` (the three M-RoPE streams are all ``positions``)."""
        if self.cfg.mrope_section is None:
            return rope_cos_sin(positions, self.inv_freq, dtype)
        streams = positions[None].expand(3, *positions.shape)
        return mrope_cos_sin(
            streams, self.inv_freq, self.cfg.mrope_section, self.cfg.mrope_interleaved, dtype
        )


class Talker(nn.Module):
    """``talker``: the decoder, text projection, codebook-0 head and the code predictor."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        hidden = cfg.transformer.hidden_size
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, hidden)
        self.codec_head = nn.Linear(hidden, cfg.transformer.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.code_predictor, hidden)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Projected text embeddings ``[..., H]`` of text token ids."""
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """Talker codec embeddings (codebook 0 and the control / speaker / language ids)."""
        return self.model.codec_embedding(ids)

    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of all G codebook embeddings of frames ``[..., G]`` -> ``[..., H]``."""
        return self.embed_codec(codes[..., 0]) + self.code_predictor.embed_codes(codes[..., 1:])

    def suppressed_ids(self, device: torch.device) -> torch.Tensor:
        """The release bans the top 1024 codec ids (control tokens) except EOS from codebook 0."""
        vocab = self.cfg.transformer.vocab_size
        ids = torch.arange(max(vocab - 1024, 0), vocab, device=device)
        return ids[ids != self.cfg.codec_eos_token_id]
