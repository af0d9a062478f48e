"""Request routing of the Qwen3-Omni pipelines (pure Python, no model code).

The preprocessing stage sends a request only to the encoders its inputs need;
the thinker waits for exactly those sources and merges what they produced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENCODER_FOR_INPUT = {
    "images": "image_encoder",
    "videos": "image_encoder",
    "audios": "audio_encoder",
}


def route_preprocessing(payload: Mapping[str, Any], *, fan_in: str = "thinker") -> list[str]:
    """Targets of one request: the encoders its media need, plus the fan-in stage."""
    encoders = {stage for key, stage in ENCODER_FOR_INPUT.items() if payload.get(key)}
    return [*sorted(encoders), fan_in]


def route_to_thinker(payload: Mapping[str, Any]) -> list[str]:
    return route_preprocessing(payload, fan_in="thinker")


def route_to_aggregate(payload: Mapping[str, Any]) -> list[str]:
    return route_preprocessing(payload, fan_in="mm_aggregate")


def merge_encoder_outputs(parts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One thinker input from the preprocessing output and each encoder's embeddings.

    ``parts`` maps source stage name to its output. The prompt comes from
    preprocessing; encoder outputs are attached under their stage names so
    the thinker can splice embeddings at the placeholder positions.
    """
    if "preprocessing" not in parts:
        raise ValueError("the thinker input needs the preprocessing output")
    merged = dict(parts["preprocessing"])
    merged["encoder_outputs"] = {
        name: out for name, out in parts.items() if name != "preprocessing"
    }
    return merged
