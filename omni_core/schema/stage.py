"""One stage of a pipeline, with its settings grouped by who reads them.

* top level (``gpu``, ``tp_size``, ``process``, ``gpu_memory_fraction`` …):
  read by the parent process for placement, process planning and wiring;
* ``engine.*`` (only on :class:`EngineStageConfig`): read by the engine backend;
* ``factory.*``: passed to the stage factory by parameter name.

The wiring fields (``next``, ``wait_for`` …) and the factory import path are
written by the pipeline author in code; deploy files and flags can never set
them (:data:`AUTHOR_ONLY_FIELDS`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .groups import PLACEMENT_OWNED_FACTORY_KEYS, EngineArgs, FactoryArgs
from .problems import SchemaProblems
from .sizes import parse_bytes

AUTHOR_ONLY_FIELDS = frozenset(
    {
        "name",
        "factory_path",
        "next",
        "terminal",
        "route_fn",
        "wait_for",
        "merge_fn",
        "stream_to",
        "author_kwargs",
        "engine_backends",
    }
)
"""Topology and code wiring: lives in the plugin's pipeline class only."""


class StageConfig(BaseModel):
    """A stage that is not driven by an engine backend (encoders, vocoders, CPU work)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False, defer_build=True)

    # -- author-only: topology and wiring --------------------------------
    name: str
    factory_path: str = Field(description="import string 'package.module:callable'")
    next: str | list[str] | None = None
    terminal: bool = False
    route_fn: str | None = None
    wait_for: list[str] | None = None
    merge_fn: str | None = None
    # [] rather than default_factory=list: pydantic copies mutable defaults, and a
    # builtin factory makes it call inspect.signature(list), whose first use compiles
    # tokenize's regular expressions: ~14 ms of every `omni` command's start-up.
    stream_to: list[str] = []
    author_kwargs: dict[str, Any] = Field(default_factory=dict)

    # -- parent process: placement and process planning ------------------
    # None: a process of its own, named after the stage (one per rank when tp_size > 1)
    process: str | None = None
    gpu: int | list[int] | None = None
    tp_size: int = 1
    gpu_memory_fraction: float | None = None
    total_reserve_bytes: int | None = None
    env: dict[str, str] = Field(default_factory=dict)

    # -- stage factory ------------------------------------------------------
    factory: SerializeAsAny[FactoryArgs] = Field(default_factory=FactoryArgs)

    @property
    def is_engine(self) -> bool:
        return False

    @property
    def targets(self) -> list[str]:
        """Stages that receive this stage's final output."""
        if self.next is None:
            return []
        return [self.next] if isinstance(self.next, str) else list(self.next)

    @property
    def gpu_ids(self) -> list[int]:
        if self.gpu is None:
            return []
        return [self.gpu] if isinstance(self.gpu, int) else list(self.gpu)

    @property
    def uses_gpu(self) -> bool:
        return self.gpu is not None

    @property
    def declares_memory_share(self) -> bool:
        return self.gpu_memory_fraction is not None or self.total_reserve_bytes is not None

    @model_validator(mode="before")
    @classmethod
    def _engine_group_only_on_engine_stages(cls, data: Any) -> Any:
        if isinstance(data, dict) and "engine" in data and "engine" not in cls.model_fields:
            raise ValueError(
                f"stage {data.get('name', '?')!r}: field 'engine' is not allowed: this stage is "
                "not an engine stage, so it has no engine.* settings; use factory.* for its "
                "factory's settings"
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _refuse_placement_owned_factory_keys(cls, data: Any) -> Any:
        # FactoryArgs refuses these too, but only here is the stage name known.
        factory = data.get("factory") if isinstance(data, dict) else None
        if isinstance(factory, dict):
            owned = sorted(PLACEMENT_OWNED_FACTORY_KEYS & set(factory))
            if owned:
                raise ValueError(
                    f"stage {data.get('name', '?')!r}: field 'factory.{owned[0]}' is owned by "
                    "placement and cannot be set; write the stage's gpu / gpu_memory_fraction / "
                    "total_reserve_bytes instead"
                )
        return data

    @field_validator("total_reserve_bytes", mode="before")
    @classmethod
    def _parse_reserve(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        try:
            return parse_bytes(value)
        except ValueError as exc:
            raise ValueError(
                f"stage {info.data.get('name', '?')!r}: field 'total_reserve_bytes': {exc}"
            ) from None

    @model_validator(mode="after")
    def _check(self) -> StageConfig:
        problems = [(fields, f"stage {self.name!r}: {text}") for fields, text in self._problems()]
        if problems:
            raise SchemaProblems(problems)
        return self

    def _problems(self) -> Iterator[tuple[tuple[str, ...], str]]:
        """Each problem with the fields it concerns (so errors can name who wrote them)."""
        if self.terminal and self.targets:
            yield (
                ("next", "terminal"),
                "field 'next' and 'terminal' are exclusive: a terminal stage has no next",
            )
        if not self.terminal and not self.targets:
            yield (
                ("next",),
                "field 'next' is missing: a stage needs either next or terminal = true",
            )
        if self.wait_for and not self.merge_fn:
            yield ("merge_fn",), "field 'merge_fn' is missing: wait_for needs a merge function"
        if self.merge_fn and not self.wait_for:
            yield (
                ("merge_fn", "wait_for"),
                "field 'merge_fn' needs field 'wait_for' (the stages to merge)",
            )
        if self.route_fn and len(self.targets) < 2:
            yield (
                ("route_fn", "next"),
                "field 'route_fn' needs field 'next' to list the targets it may choose from",
            )
        if self.tp_size < 1:
            yield ("tp_size",), f"field 'tp_size' must be >= 1, got {self.tp_size}"
        yield from self._gpu_problems()
        share = ("gpu_memory_fraction", "total_reserve_bytes")
        if self.gpu_memory_fraction is not None and not 0 < self.gpu_memory_fraction <= 1:
            yield (
                ("gpu_memory_fraction",),
                f"field 'gpu_memory_fraction' must be in (0, 1], got {self.gpu_memory_fraction}",
            )
        if self.gpu_memory_fraction is not None and self.total_reserve_bytes is not None:
            yield (
                share,
                "fields 'gpu_memory_fraction' and 'total_reserve_bytes' are exclusive: "
                "declare the memory share one way",
            )
        if self.declares_memory_share and self.gpu is None:
            yield (
                (*share, "gpu"),
                "field 'gpu_memory_fraction'/'total_reserve_bytes' needs field 'gpu' (a GPU stage)",
            )

    def _gpu_problems(self) -> Iterator[tuple[tuple[str, ...], str]]:
        if isinstance(self.gpu, int) and self.tp_size > 1:
            yield (
                ("gpu", "tp_size"),
                f"field 'gpu' is a single id but tp_size = {self.tp_size}; "
                f"write a list of {self.tp_size} GPU ids",
            )
        if isinstance(self.gpu, list) and len(self.gpu) != self.tp_size:
            yield (
                ("gpu", "tp_size"),
                f"field 'gpu' lists {len(self.gpu)} GPU ids but tp_size = {self.tp_size}; "
                "they must match",
            )
        ids = self.gpu_ids
        if any(i < 0 for i in ids):
            yield ("gpu",), f"field 'gpu' has a negative GPU id: {ids}"
        if len(set(ids)) != len(ids):
            yield ("gpu",), f"field 'gpu' repeats a GPU id: {ids}"


class EngineStageConfig(StageConfig):
    """A stage driven by an engine backend (continuous batching, KV cache)."""

    engine: SerializeAsAny[EngineArgs] = Field(default_factory=EngineArgs)
    # author-only: the engine backends this stage's factory can drive (engine.backend
    # naming another is refused at planning). SGLang serves Qwen3 / Qwen3-MoE decoders.
    engine_backends: list[str] = ["torch"]

    @property
    def is_engine(self) -> bool:
        return True
