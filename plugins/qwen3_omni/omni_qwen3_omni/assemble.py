"""Putting the encoders' outputs where the prompt's placeholders are.

Preprocessing writes the prompt with one placeholder token per encoder
output row (``<|image_pad|>``, ``<|audio_pad|>``), in the order the media
appear; the encoders produce those rows in the same order. Assembly checks
that the counts agree (a mismatch would shift every later row onto the wrong
token) and returns the wire form of an
:class:`~omni_core.engine.prompt.EmbeddedPrompt`: plain tensors and lists, so
the aggregation may run in another process than the thinker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omni_core.engine.prompt import EmbeddedPrompt

from .config import ThinkerConfig


class AssemblyError(RuntimeError):
    """Encoder outputs that do not fit the prompt's placeholders (a bug, not bad input)."""


def assemble(pre: Mapping[str, Any], encoders: Mapping[str, Any], ids: ThinkerConfig) -> dict:
    """The thinker's prompt, from preprocessing's output and each encoder's output."""
    token_ids = torch.as_tensor(pre["prompt"]["token_ids"], dtype=torch.long)
    image_at = torch.nonzero(
        (token_ids == ids.image_token_id) | (token_ids == ids.video_token_id)
    ).flatten()
    audio_at = torch.nonzero(token_ids == ids.audio_token_id).flatten()
    index, rows = [], []
    additions: list[torch.Tensor] = []
    if len(image_at):
        vision = encoders.get("image_encoder")
        if vision is None:
            raise AssemblyError("the prompt has image placeholders but no image_encoder output")
        _expect(vision["embeds"], len(image_at), "image")
        index.append(image_at)
        rows.append(vision["embeds"])
        additions = list(vision.get("deepstack") or [])
    if len(audio_at):
        audio = encoders.get("audio_encoder")
        if audio is None:
            raise AssemblyError("the prompt has audio placeholders but no audio_encoder output")
        _expect(audio["embeds"], len(audio_at), "audio")
        index.append(audio_at)
        rows.append(audio["embeds"])
    return {
        "token_ids": pre["prompt"]["token_ids"],
        "positions": pre["prompt"].get("positions"),
        "next_position": pre["prompt"].get("next_position"),
        "embeddings": torch.cat(rows) if rows else None,
        "embedding_index": torch.cat(index) if index else None,
        "layer_additions": additions,
        "addition_index": image_at if additions else None,
    }


def _expect(rows: torch.Tensor, placeholders: int, kind: str) -> None:
    if rows.shape[0] != placeholders:
        raise AssemblyError(
            f"the {kind} encoder produced {rows.shape[0]} rows for {placeholders} "
            f"<|{kind}_pad|> placeholders"
        )


def to_prompt(wire: Mapping[str, Any]) -> EmbeddedPrompt:
    """The engine's prompt object from the wire form (validates shapes and indexes)."""
    return EmbeddedPrompt(
        token_ids=list(wire["token_ids"]),
        positions=wire.get("positions"),
        next_position=wire.get("next_position"),
        embeddings=wire.get("embeddings"),
        embedding_index=wire.get("embedding_index"),
        layer_additions=list(wire.get("layer_additions") or []),
        addition_index=wire.get("addition_index"),
    )
