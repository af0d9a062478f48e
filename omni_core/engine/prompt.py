"""Prompts that are more than token ids: embeddings at some positions, additions after layers.

Multimodal decoders take an image or a clip as rows of precomputed
embeddings placed where the prompt holds placeholder tokens, and some (the
Qwen3-VL family's "deepstack") add further rows to the hidden states after
the first few layers, at the same positions. Positions may come in several
streams (multimodal rotary positions: temporal, height, width). None of that
is specific to one model, so the prompt type lives with the engine: a
:class:`StepModel` for such a decoder accepts an :class:`EmbeddedPrompt`,
splices it with :func:`splice_embeddings`, and applies
:attr:`EmbeddedPrompt.layer_additions` in its forward pass. The prompt is
prefilled once; decoding continues from :attr:`next_position`.

Torch is imported lazily: the type is also built in stages that only
prepare prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EmbeddedPrompt:
    """A decoder prompt of ``len(token_ids)`` positions.

    ``embeddings`` ``[n, H]`` replace the token embeddings at the prompt
    indexes ``embedding_index`` ``[n]`` (ascending). ``layer_additions[i]``
    ``[m, H]`` is added to the hidden states after decoder layer ``i`` at
    ``addition_index`` ``[m]``. ``positions`` ``[S, T]`` are the rotary
    positions of each stream (None: ``0..T-1``); ``next_position`` is the
    position of the first generated token (the same in every stream).
    """

    token_ids: list[int]
    positions: Any = None  # torch.LongTensor [streams, T] or None
    next_position: int | None = None
    embeddings: Any = None  # torch.Tensor [n, H] or None
    embedding_index: Any = None  # torch.LongTensor [n] or None
    layer_additions: list[Any] = field(default_factory=list)  # per layer: Tensor [m, H]
    addition_index: Any = None  # torch.LongTensor [m] or None

    def __post_init__(self) -> None:
        length = len(self.token_ids)
        if length < 1:
            raise ValueError("a prompt needs at least one position")
        if (self.embeddings is None) != (self.embedding_index is None):
            raise ValueError("embeddings and embedding_index come together")
        if self.embeddings is not None:
            _check_rows("embeddings", self.embeddings, self.embedding_index, length)
        if self.layer_additions:
            if self.addition_index is None:
                raise ValueError("layer_additions need addition_index")
            for i, rows in enumerate(self.layer_additions):
                _check_rows(f"layer_additions[{i}]", rows, self.addition_index, length)
        if self.positions is not None and tuple(self.positions.shape[1:]) != (length,):
            raise ValueError(
                f"positions {tuple(self.positions.shape)} do not cover the prompt's {length} "
                "positions"
            )

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def first_decode_position(self) -> int:
        return self.next_position if self.next_position is not None else len(self.token_ids)


def _check_rows(what: str, rows: Any, index: Any, length: int) -> None:
    if rows.dim() != 2 or index.dim() != 1 or rows.shape[0] != index.shape[0]:
        raise ValueError(
            f"{what}: {tuple(rows.shape)} rows for {tuple(index.shape)} indexes; "
            "one [n, H] row per index"
        )
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= length):
        raise ValueError(f"{what}: an index lies outside the prompt's {length} positions")


def splice_embeddings(token_embeddings: Any, prompt: EmbeddedPrompt) -> Any:
    """``[T, H]`` token embeddings with the prompt's embedding rows put in place (a copy)."""
    if prompt.embeddings is None:
        return token_embeddings
    out = token_embeddings.clone()
    out[prompt.embedding_index.to(out.device)] = prompt.embeddings.to(out.device, out.dtype)
    return out


def prefix_rows(prompt: EmbeddedPrompt) -> Any:
    """What decides each position's keys and values, one int64 row per position.

    For the engine's shared prompt heads (:mod:`omni_core.engine.prefix_cache`):
    a row holds the token id, the position in every rotary stream, and a
    16-byte digest of the rows spliced in or added after layers there (zero
    where there are none). Two prompts whose rows agree up to a position
    give that position the same keys and values in a decoder that reads
    nothing else: the same system prompt and image, a conversation's
    previous turn. A digest rather than the rows themselves: an image is
    hundreds of rows of thousands of values, hashed once here.
    """
    import hashlib

    import torch

    length = len(prompt)
    positions = (
        prompt.positions.detach().to("cpu", torch.long)
        if prompt.positions is not None
        else torch.arange(length)[None]
    )
    rows = torch.zeros(length, 1 + positions.shape[0] + 2, dtype=torch.long)
    rows[:, 0] = torch.as_tensor(prompt.token_ids, dtype=torch.long)
    rows[:, 1 : 1 + positions.shape[0]] = positions.T
    digests: dict[int, Any] = {}
    parts = []
    if prompt.embeddings is not None:
        parts.append((prompt.embedding_index, prompt.embeddings))
    parts += [(prompt.addition_index, rows_) for rows_ in prompt.layer_additions]
    for index, values in parts:
        data = values.detach().to("cpu").contiguous()
        raw = data.reshape(data.shape[0], -1).view(torch.uint8).numpy()
        for where, row in zip(index.tolist(), raw, strict=True):
            digests.setdefault(where, hashlib.blake2b(digest_size=16)).update(row)
    for where, digest in digests.items():
        rows[where, -2:] = torch.frombuffer(bytearray(digest.digest()), dtype=torch.long)
    return rows
