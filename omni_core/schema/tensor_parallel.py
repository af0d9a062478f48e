"""Which stages may run with ``tp_size > 1``, checked before any process starts.

A stage runs tensor-parallel only where its factory splits its weights over
the ranks (the pipeline lists it in ``tensor_parallel_stages``: omni's torch
engine then runs one process per rank, see ``omni_core.engine.tp``), or where
its engine backend brings its own tensor parallelism (``engine.backend =
"sglang"``: SGLang's ``tp_size``, its scheduler ranks started by the engine
inside the stage's one omni process). Every other stage with ``tp_size > 1``
is refused here, and so is a ``tp_size`` that does not divide the model's
head counts and widths (``PipelineConfig.tensor_parallel_sizes``, read from
the checkpoint's config without loading it), naming the numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .pipeline import PipelineConfig, SourceProblem

#: Engine backends whose engine runs the ranks itself (one omni process per stage).
ENGINE_TP_BACKENDS = frozenset({"sglang"})


def engine_runs_ranks(stage: Any) -> bool:
    """Whether ``stage``'s engine backend starts its tensor-parallel ranks itself."""
    engine = getattr(stage, "engine", None) if stage.is_engine else None
    return getattr(engine, "backend", "torch") in ENGINE_TP_BACKENDS


def tensor_parallel_problems(config: PipelineConfig) -> list[SourceProblem]:
    problems: list[SourceProblem] = []
    supported = tuple(type(config).tensor_parallel_stages)
    for stage in config.stages:
        size = stage.tp_size
        if size <= 1 or engine_runs_ranks(stage):
            continue
        path = (("stages", stage.name, "tp_size"),)
        if stage.name not in supported:
            where = (
                f"stage{'s' if len(supported) > 1 else ''} {', '.join(supported)}"
                if supported
                else f"no stage of pipeline {type(config).pipeline_name!r}"
            )
            problems.append(
                (
                    path,
                    f"stage {stage.name!r} has tp_size {size}, but its factory does not split "
                    f"its weights over ranks; tensor parallelism is implemented for {where}",
                    f"set tp_size = 1 for stage {stage.name!r} (--{stage.name}.tp_size 1)",
                )
            )
            continue
        if getattr(getattr(stage, "engine", None), "enable_torch_compile", False):
            problems.append(
                (
                    (*path, ("stages", stage.name, "engine", "enable_torch_compile")),
                    f"stage {stage.name!r}: engine.enable_torch_compile with tp_size {size} is "
                    "not implemented yet (a compiled step would run its all-reduces on rank 0 "
                    "alone)",
                    f"set tp_size = 1 or engine.enable_torch_compile = false for {stage.name!r}",
                )
            )
        sizes = config.tensor_parallel_sizes(stage.name)
        bad = {name: value for name, value in sizes.items() if value % size}
        if bad:
            listed = ", ".join(f"{name} ({value})" for name, value in bad.items())
            fits = [n for n in range(1, max(sizes.values()) + 1) if _divides(n, sizes)]
            problems.append(
                (
                    path,
                    f"stage {stage.name!r}: tp_size {size} does not divide the model's {listed}; "
                    "each rank holds whole heads and equal slices",
                    f"use a tp_size that divides {', '.join(map(str, sizes.values()))}: "
                    + ", ".join(map(str, fits[:8])),
                )
            )
    return problems


def _divides(n: int, sizes: dict[str, int]) -> bool:
    return all(value % n == 0 for value in sizes.values())
