"""How each torch engine stage prefills: its step's prompt budget, and where long prompts go.

Why in the plan: a prompt longer than one step's ``engine.max_prefill_tokens``
is either prefilled in chunks (the running requests decode between them) or
refused at submit; which one, and at what chunk size, decides both the
longest prompt a deployment serves and how long a new prompt may hold the
others' next tokens. The model decides whether it can chunk
(``chunked_prefill``), and the plan loads no model, so it says "where the
model offers it" (the Qwen3-Omni thinker and talker, MOSS-TTS).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..engine.backends import engine_settings


def plan_prefills(config: Any, placed: Mapping[str, Any]) -> dict[str, str]:
    """Each placed torch engine stage's prefill plan in words, by stage name."""
    found: dict[str, str] = {}
    for stage in config.stages:
        if not getattr(stage, "is_engine", False) or stage.name not in placed:
            continue
        settings = engine_settings(stage)
        if settings.backend != "torch":
            continue
        budget, chunk = settings.max_prefill_tokens, settings.prefill_chunk
        words = f"at most {budget} prompt positions a step (engine.max_prefill_tokens)"
        if chunk is None:
            words += "; a longer prompt is refused (engine.chunked_prefill_size is -1)"
        else:
            longer = "a longer prompt" if chunk == budget else f"a prompt over {chunk} positions"
            words += (
                f"; {longer} in chunks of {chunk}, the running requests decoding between "
                "them, where the model offers it (engine.chunked_prefill_size), else refused"
            )
        found[stage.name] = words
    return found
