"""The two free-form setting groups of a stage: ``factory.*`` and ``engine.*``.

A pipeline author subclasses these to declare typed fields; keys nobody
declared still pass through to their consumer (the stage factory or the
engine backend), which must refuse what it does not accept, by name.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from ..errors import suggestion
from .problems import SchemaProblems

# Values owned by placement: the planner computes them, nobody writes them.
PLACEMENT_OWNED_FACTORY_KEYS = frozenset(
    {"gpu_id", "gpu_ids", "device", "gpu_memory_fraction", "total_gpu_memory_fraction"}
)


# Spellings the model plugins' loaders accept, for their factory.* declarations.
DType = Literal["auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"]
LoadFormat = Literal["auto", "safetensors", "dummy"]  # dummy: seeded random weights
# factory.quantization of a decoder: int8 weight-only linear layers (omni_core.engine.quantize),
# or w8a8_int8, int8 weights and per-row int8 activations (omni_core.engine.w8a8; SGLang's name)
Quantization = Literal["none", "int8", "w8a8_int8"]


class SettingsGroup(BaseModel):
    """Base of a group: declared fields typed, undeclared keys allowed."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, defer_build=True)

    def free_keys(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class FactoryArgs(SettingsGroup):
    """Settings passed to a stage factory by parameter name (config channel).

    A subclass declares its factory's settings, with their types and value
    constraints (``Field(ge=1)``, ``Literal[...]``), and then undeclared keys
    are refused when the deployment is resolved, with a suggestion, instead
    of by the factory in a child process. A subclass whose factory takes
    more than it declares says so with ``allow_extra_keys = True``. The base
    class itself (a stage that declares nothing) passes every key through.
    """

    allow_extra_keys: ClassVar[bool] = False

    @model_validator(mode="before")
    @classmethod
    def _refuse_undeclared(cls, data: Any) -> Any:
        if cls is FactoryArgs or cls.allow_extra_keys or not isinstance(data, dict):
            return data
        declared = cls.model_fields
        unknown = sorted(
            k for k in data if k not in declared and k not in PLACEMENT_OWNED_FACTORY_KEYS
        )
        if unknown:
            raise SchemaProblems(
                [
                    (
                        (key,),
                        f"{key!r} is not a setting of this stage's factory; "
                        + suggestion(key, declared, kind="its settings"),
                    )
                    for key in unknown
                ]
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _refuse_placement_owned(cls, data: Any) -> Any:
        if isinstance(data, dict):
            owned = sorted(PLACEMENT_OWNED_FACTORY_KEYS & set(data))
            if owned:
                raise ValueError(
                    f"factory.{owned[0]} is owned by placement and cannot be set; "
                    "write the stage's gpu / gpu_memory_fraction / total_reserve_bytes instead"
                )
        return data


class EngineArgs(SettingsGroup):
    """Settings read by the engine backend of an engine stage.

    The common fields are typed here so that flags and files coerce to the
    right types early; their ranges, and every other key, are the backend's
    to check (``omni_core.engine.backends``: one model per backend), which
    happens right after resolution, naming where each value came from.
    """

    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
