"""Batch-size buckets for compiled and captured decode steps (pure arithmetic, no torch).

A compiled step (``engine.enable_torch_compile``) or a captured CUDA graph
has static shapes: it runs one batch size. So decode batches are rounded up
to a *bucket*: 1, 2, 4, 8, ... up to ``engine.cuda_graph_max_bs`` (which is
itself a bucket, as in SGLang, even when it is not a power of two). A batch
of 3 runs in the 4-bucket with one padding row; a batch larger than the
largest bucket runs eagerly. Each bucket is compiled (and captured) once, at
start-up, so no request pays for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .interface import EngineSettings


def batch_buckets(max_bs: int) -> tuple[int, ...]:
    """``1, 2, 4, ...`` below ``max_bs``, then ``max_bs`` itself."""
    if max_bs < 1:
        raise ValueError(f"the largest batch bucket must be >= 1, got {max_bs}")
    sizes, size = [], 1
    while size < max_bs:
        sizes.append(size)
        size *= 2
    sizes.append(max_bs)
    return tuple(sizes)


def bucket_for(batch: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds ``batch`` rows; None when none does (run eagerly)."""
    for size in buckets:
        if size >= batch:
            return size
    return None


@dataclass(frozen=True)
class StaticPlan:
    """Which static decode paths an engine uses, and for which batch sizes.

    ``compile``: torch.compile (inductor) per bucket; ``cuda_graphs``: each
    bucket captured as a CUDA graph (CUDA devices only); no ``buckets``: the
    eager step. Buckets with neither runs the static-shape step uncompiled
    (what tests and benchmarks compare against). ``reason`` says why the plan
    is what it is, for the start-up log. ``prepack``: compiled CPU steps may
    pack their weights for inductor's GEMM template (:mod:`.prepack` decides
    per decoder).
    """

    compile: bool
    cuda_graphs: bool
    buckets: tuple[int, ...]
    reason: str
    prepack: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.buckets)


def static_plan(settings: EngineSettings, device_type: str) -> StaticPlan:
    """The static decode paths ``settings`` ask for on a ``device_type`` (``cpu``, ``cuda``).

    CUDA graphs are on by default on CUDA (``engine.disable_cuda_graph``
    turns them off), as in SGLang; on any other device there is nothing to
    capture. ``engine.cuda_graph_max_bs`` (default: ``max_running_requests``)
    names the largest bucket, for compiled steps too.
    """
    max_bs = settings.cuda_graph_max_bs or settings.max_running_requests
    max_bs = min(max_bs, settings.max_running_requests)  # a bigger batch never forms
    graphs = device_type == "cuda" and not settings.disable_cuda_graph
    compile_ = bool(settings.enable_torch_compile)
    parts = []
    if compile_:
        parts.append("torch.compile")
    if graphs:
        parts.append("CUDA graphs")
    if not parts:
        why = (
            "engine.disable_cuda_graph"
            if device_type == "cuda"
            else "engine.enable_torch_compile is off"
        )
        return StaticPlan(False, False, (), f"eager decode ({why})")
    buckets = batch_buckets(max_bs)
    prepack = compile_ and device_type == "cpu" and settings.cpu_weight_prepack
    if prepack:
        parts.append("weights prepacked where they fit the CPU's last-level cache or are int8")
    return StaticPlan(
        compile_,
        graphs,
        buckets,
        f"{' + '.join(parts)} for batch sizes {', '.join(map(str, buckets))} "
        f"(engine.cuda_graph_max_bs {max_bs}; larger batches run eagerly)",
        prepack,
    )
