"""The ``engine.*`` keys of a stage on the ``sglang`` backend: SGLang's own ServerArgs.

A stage with ``engine.backend = "sglang"`` accepts every field of the pinned
SGLang version's ``ServerArgs`` (``omni_core/engine/sglang_args.py``, generated
by ``tools/gen_sglang_args.py``), checked by name and kind in the parent
process without importing SGLang. Three kinds of key are treated apart:

* **omni's own** (:data:`OMNI_OWNED`): omni sets them from the stage (the
  model directory, the tokenizer being skipped, the model class, hidden-state
  return); writing one is refused, saying where the value comes from.
* **placement's** (:data:`PLACEMENT_KEYS`): the device, GPU, memory share and
  ``tp_size`` come from the stage's placement and are passed through; an
  ``engine.*`` value that contradicts placement is refused with both origins
  (:func:`placement_conflicts`).
* **renamed** (:data:`RENAMED`): spellings from older SGLang releases that deploy
  files in the wild use (the seed's ``cuda_graph_max_bs``) are accepted and passed
  under today's name.

The keys the rest of omni reads before an engine exists (the planner's KV
budget, the runtime's admission limit) get the torch backend's defaults, and
are passed to SGLang explicitly so that planning and the engine agree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model

from .sglang_args import SERVER_ARGS, SGLANG_VERSION

#: Keys omni sets itself, and where their value comes from.
OMNI_OWNED: dict[str, str] = {
    "model_path": "the stage's model_path (a dummy checkpoint is written for load_format dummy)",
    "tokenizer_path": "omni tokenizes in its preprocessing stage",
    "skip_tokenizer_init": "omni sends token ids and detokenizes in its decode stage",
    "json_model_override_args": "omni selects its own model class for the stage",
    "enable_return_hidden_states": "omni turns it on when a stage feeds a talker",
    "load_format": "the stage's factory.load_format",
    "dtype": "the stage's factory.dtype",
    "host": "the engine runs inside the stage's process; it serves no HTTP",
    "port": "the engine runs inside the stage's process; it serves no HTTP",
}

#: ServerArgs fields placement decides; the stage field (or policy) that sets each.
PLACEMENT_KEYS: dict[str, str] = {
    "device": "placement (the stage's gpu, or a cpu placement policy)",
    "base_gpu_id": "the stage's gpu",
    "tp_size": "the stage's tp_size",
    "mem_fraction_static": "the stage's gpu_memory_fraction",
}

#: Older SGLang spellings still accepted, and the ServerArgs field each is now.
RENAMED: dict[str, str] = {
    "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
}

#: What omni's planner and admission read, with the torch backend's defaults.
OMNI_DEFAULTS: dict[str, Any] = {
    "max_running_requests": 8,
    "max_total_tokens": 16384,
    "max_prefill_tokens": 8192,
}

_SCALARS: dict[str, Any] = {"int": int, "float": float, "bool": bool, "str": str}


def _annotation(kind: str) -> Any:
    nullable = kind.startswith("?")
    kind = kind.lstrip("?")
    if kind in _SCALARS:
        base: Any = _SCALARS[kind]
    elif kind.startswith("choice:"):
        base = Literal[tuple(json.loads(kind.partition(":")[2]))]  # type: ignore[misc]
    elif kind == "list":
        base = list
    elif kind == "dict":
        base = dict
    else:
        base = Any
    return Optional[base] if nullable else base  # noqa: UP045 (a runtime type expression)


def _fields() -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, (kind, _default, help_text) in SERVER_ARGS.items():
        if name in OMNI_OWNED or name.startswith("_"):
            continue  # omni's to set, or SGLang's private bookkeeping
        default = OMNI_DEFAULTS.get(name)
        annotation = _annotation(kind)
        if default is None:
            annotation = Optional[annotation]  # noqa: UP045 (unset: SGLang decides)
        fields[name] = (annotation, Field(default=default, description=help_text))
    return fields


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    def server_args(self) -> dict[str, Any]:
        """The keys to hand SGLang: what was written plus omni's planning defaults."""
        written = self.model_dump(exclude_unset=True, exclude_none=True)
        written.pop("backend", None)
        return {**OMNI_DEFAULTS, **written}


#: The ``engine.*`` model of an sglang stage (``backend`` plus every non-owned field).
SGLangSettings: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "SGLangSettings",
    __base__=_Base,
    __doc__=f"engine.* on the sglang backend: SGLang {SGLANG_VERSION} ServerArgs",
    backend=(str, Field(default="sglang", description="engine backend")),
    **_fields(),
)


def normalise(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with renamed spellings under today's names (a clash is the caller's to
    report: both spellings in one group is refused by :func:`renamed_clashes`)."""
    out = dict(data)
    for old, new in RENAMED.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
    return out


def renamed_clashes(data: Mapping[str, Any]) -> list[str]:
    return [old for old, new in RENAMED.items() if old in data and new in data]


def describe_key(key: str) -> str:
    """One line on how the sglang backend reads ``engine.<key>`` (for ``config explain``)."""
    if key == "backend":
        return "selects the engine backend"
    if key in OMNI_OWNED:
        return f"set by omni, not by engine.*: {OMNI_OWNED[key]}"
    if key in RENAMED:
        return (
            f"an older SGLang spelling: passed to SGLang {SGLANG_VERSION} as "
            f"ServerArgs.{RENAMED[key]}"
        )
    if key not in SERVER_ARGS:
        return f"not a field of SGLang {SGLANG_VERSION}'s ServerArgs"
    kind, default, help_text = SERVER_ARGS[key]
    where = f"; also set by {PLACEMENT_KEYS[key]}" if key in PLACEMENT_KEYS else ""
    shown = OMNI_DEFAULTS.get(key, default)
    return (
        f"read by SGLang {SGLANG_VERSION} as ServerArgs.{key} ({kind.lstrip('?')}, default "
        f"{shown!r}){where}: {help_text}"
    )


def placement_conflicts(stage: Any, settings: BaseModel) -> list[tuple[str, str, str]]:
    """``(engine key, stage field, message)`` for each engine value placement contradicts."""
    conflicts = []
    tp = getattr(settings, "tp_size", None)
    if tp is not None and tp != stage.tp_size:
        conflicts.append(
            (
                "tp_size",
                "tp_size",
                f"engine.tp_size {tp} contradicts the stage's tp_size {stage.tp_size}",
            )
        )
    share = getattr(settings, "mem_fraction_static", None)
    if (
        share is not None
        and stage.gpu_memory_fraction is not None
        and abs(share - stage.gpu_memory_fraction) > 1e-9
    ):
        conflicts.append(
            (
                "mem_fraction_static",
                "gpu_memory_fraction",
                f"engine.mem_fraction_static {share} contradicts the stage's gpu_memory_fraction "
                f"{stage.gpu_memory_fraction}",
            )
        )
    base = getattr(settings, "base_gpu_id", None)
    gpu = stage.gpu[0] if isinstance(stage.gpu, list) and stage.gpu else stage.gpu
    if base is not None and gpu is not None and base != gpu:
        conflicts.append(
            ("base_gpu_id", "gpu", f"engine.base_gpu_id {base} contradicts the stage's gpu {gpu}")
        )
    device = getattr(settings, "device", None)
    if device is not None and gpu is not None and str(device).startswith("cpu"):
        conflicts.append(
            ("device", "gpu", f"engine.device {device!r} contradicts the stage's gpu {gpu}")
        )
    return conflicts
