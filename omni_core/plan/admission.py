"""How many requests the runtime admits at once, decided at planning time.

The planner puts the number in the plan (``omni plan`` shows it) and the
runtime enforces the same function's answer, so what a user reads before
serving is what the server does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..engine.backends import engine_settings, with_running_requests

DEFAULT_INFLIGHT_PER_REPLICA = 64
"""The limit per replica of a pipeline with no engine stage (nothing else bounds it)."""


def admission_limit(
    config: Any, replicas: Mapping[str, int], running: Mapping[str, int] | None = None
) -> int:
    """``runtime.max_inflight``, else the engine stages' limits times their replicas.

    An engine stage's limit is read from the settings its backend validated,
    defaults included: the number the engine itself will run, not only what
    the deploy file happened to write. The smallest engine limit wins (a
    request passes through every engine stage). ``replicas`` maps each
    logical process to its replica count; ``running`` is the plan's
    ``running_requests`` (the limits it sized from memory, by stage).
    """
    if config.runtime.max_inflight is not None:
        return config.runtime.max_inflight
    limits = []
    for stage in config.stages:
        if not stage.is_engine:
            continue
        count = replicas.get(config.process_of(stage), 1)
        settings = with_running_requests(engine_settings(stage), (running or {}).get(stage.name))
        per_replica = settings.max_running_requests
        if per_replica:
            limits.append(per_replica * count)
    if limits:
        return min(limits)
    return DEFAULT_INFLIGHT_PER_REPLICA * max(replicas.values(), default=1)
