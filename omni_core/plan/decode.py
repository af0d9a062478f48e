"""How each torch engine stage will decode: eager, compiled, CUDA graphs, prepacked weights.

Why in the plan: compiled steps and prepacked weights cost start-up time and
memory, so an operator should see what a deploy file asks for before any
process starts, beside the precision it applies to. The engine makes the same
decision (:func:`~omni_core.engine.buckets.static_plan`) when it starts, and
its log adds what only the loaded model knows (which decoders were packed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..engine.backends import engine_settings, with_running_requests
from ..engine.buckets import static_plan
from .model import Assignment

#: Below this ``runtime.startup_timeout`` (seconds), a deployment whose stages compile
#: their decode steps gets a note to raise it. Every bucket compiles before the process
#: says ready, and with a cold inductor cache that takes minutes: measured on 2 cores,
#: Qwen3-TTS 0.6B, batch sizes 1-8, compiled 75 s with a cold cache (each layer built
#: once; 494 s as whole graphs; 14 s warm), 49 s (8 s warm) since one graph a bucket
#: serves every attention span, 34 s (6 s warm) since buckets 2-8 share one, 34 s (4 s
#: warm) since bucket 1 shares it too, prepacked too 710 s (105 s warm), int8 prepacked
#: 862 s; the default timeout is 120 s.
COMPILE_STARTUP_SECONDS = 900.0


def plan_decodes(
    config: Any,
    assignments: Mapping[str, Assignment],
    instances: Mapping[str, str],
    precisions: Mapping[str, Any],
    running: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """Each torch engine stage's decode plan in words, by stage name (first instance's device).

    ``running``: the ``engine.max_running_requests`` the plan sized from memory, by
    stage (its buckets reach that number, as the engine's will).
    """
    device_of: dict[str, str] = {}
    for instance, assignment in assignments.items():
        stage = instances.get(instance, instance)
        device_of.setdefault(stage, "cuda" if assignment.gpus else "cpu")
    found: dict[str, str] = {}
    for stage in config.stages:
        if not getattr(stage, "is_engine", False) or stage.name not in device_of:
            continue
        settings = with_running_requests(engine_settings(stage), (running or {}).get(stage.name))
        if settings.backend != "torch":
            continue
        plan = static_plan(settings, device_of[stage.name])
        words = plan.reason
        precision = precisions.get(stage.name)
        dtype = getattr(precision, "dtype", None)
        if plan.prepack and dtype not in (None, "bfloat16"):
            words += f"; engine.cpu_weight_prepack packs nothing: the stage computes in {dtype}"
        elif settings.cpu_weight_prepack and not plan.prepack:
            words += "; engine.cpu_weight_prepack packs nothing on a GPU"
        found[stage.name] = words
    return found


def compile_startup_note(config: Any, decodes: Mapping[str, str]) -> str | None:
    """Advice when stages compile at start-up and ``runtime.startup_timeout`` is short."""
    compiling = sorted(stage for stage, words in decodes.items() if "torch.compile" in words)
    timeout = config.runtime.startup_timeout
    if not compiling or timeout >= COMPILE_STARTUP_SECONDS:
        return None
    who = (
        f"{compiling[0]} compiles its decode steps for every batch size before its process "
        "says ready"
        if len(compiling) == 1
        else f"{', '.join(compiling)} compile their decode steps for every batch size before "
        "their processes say ready"
    )
    return (
        f"{who}, which takes minutes with a cold inductor cache "
        "(Qwen3-TTS 0.6B, batch sizes 1-8, 2 cores: 34 s, with cpu_weight_prepack 710 s; "
        "4 and 105 s once inductor's cache, TORCHINDUCTOR_CACHE_DIR, holds them), but "
        f"runtime.startup_timeout is {timeout:g} s: raise it "
        f"(--runtime.startup_timeout {COMPILE_STARTUP_SECONDS * 2:g}) or the process is "
        "stopped while it compiles"
    )
