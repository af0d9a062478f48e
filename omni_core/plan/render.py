"""The plan as people read it: tables of processes and GPUs, then the rest."""

from __future__ import annotations

import sys
from typing import IO, Any

from ..schema.sizes import format_bytes
from ..text_table import box_table
from .model import DeploymentPlan
from .pages import describe as describe_huge_pages
from .threads import SPIN_VAR


def _share(fraction: float | None, reserve: int | None) -> str:
    parts = []
    if fraction is not None:
        parts.append(f"{fraction:.2f}")
    if reserve is not None:
        parts.append(format_bytes(reserve))
    return " + ".join(parts) or "-"


def _engine_share(plan: Any, process: str) -> str:
    """``engine 0.80``: a process whose engine sizes itself by ``engine.mem_fraction_static``."""
    fractions = [
        s.engine_memory_fraction
        for s in plan.stages
        if s.process == process and s.engine_memory_fraction is not None
    ]
    return f"engine {sum(fractions):.2f}" if fractions else "-"


def _where(process: Any) -> str:
    """``GPU 1``; on a multi-node plan ``b: GPU 0`` (the node, and the GPU's id there)."""
    if process.node is None:
        return "CPU" if process.gpu is None else f"GPU {process.gpu}"
    return f"{process.node}: " + ("CPU" if process.gpu is None else f"GPU {process.node_gpu}")


def _threads(plan: DeploymentPlan) -> str:
    """Why each process got its torch thread count, grouped by reason."""
    groups: dict[str, list[str]] = {}
    for process in plan.processes:
        groups.setdefault(process.threads_source or "unplanned", []).append(process.name)
    text = "; ".join(f"{source}: {', '.join(names)}" for source, names in groups.items())
    spins = sorted({p.env[SPIN_VAR] for p in plan.processes if SPIN_VAR in p.env})
    if spins:  # plan/threads.py: the processes share the cores
        text += f"; idle OpenMP threads spin {'/'.join(spins)} turns ({SPIN_VAR})"
    return text


def _tp_column(process: Any) -> str:
    """``rank/size`` of a rank process; ``N in SGLang`` where the engine starts the ranks."""
    if process.engine_ranks:
        return f"{process.engine_ranks} in SGLang"
    return "-" if process.tp_rank is None else f"{process.tp_rank}/{process.tp_size}"


def render_plan(
    plan: DeploymentPlan, file: IO[str] | None = None, width: int | None = None
) -> None:
    """Print ``plan`` to ``file`` (stdout by default), tables at most ``width`` wide."""
    out = file if file is not None else sys.stdout
    width = width or 120

    def say(text: str) -> None:
        print(text, file=out)

    say(f"{plan.pipeline}  model {plan.model_path or '-'}  placement policy {plan.policy}")
    say(f"GPUs: {plan.inventory.describe()}")

    say("processes")
    rows = [
        [
            process.name,
            _where(process),
            ", ".join(process.stages),
            f"{process.replica}/{process.num_replicas}" if process.num_replicas > 1 else "-",
            _tp_column(process),
            _share(process.gpu_memory_fraction, process.total_reserve_bytes)
            if process.gpu_memory_fraction is not None or process.total_reserve_bytes is not None
            else _engine_share(plan, process.name),
            f"wave {process.start_wave}"
            + (f" ({process.weight_share})" if process.weight_share != "none" else ""),
            "-" if process.cpu_threads is None else str(process.cpu_threads),
        ]
        for process in plan.processes
    ]
    columns = ("process", "where", "stages", "replica", "tp rank", "share", "start", "threads")
    say(box_table(columns, rows, width))
    say("cpu threads: " + _threads(plan))
    pages = describe_huge_pages(plan.processes)
    if pages:
        say("cpu memory: " + pages)

    if plan.gpus:
        rows = []
        for gpu, usage in plan.gpus.items():
            committed = usage.committed
            mps = plan.mps.gpus.get(gpu)
            rows.append(
                [
                    str(gpu),
                    format_bytes(usage.memory_bytes) if usage.memory_bytes else "?",
                    ", ".join(usage.stages),
                    f"{usage.gpu_memory_fraction_sum:.2f}"
                    + (
                        f" + {format_bytes(usage.total_reserve_bytes_sum)}"
                        if usage.total_reserve_bytes_sum
                        else ""
                    )
                    + (
                        f" + engines {usage.engine_fraction_sum:.2f}"
                        if usage.engine_memory_fractions
                        else ""
                    )
                    + (
                        f" (= {committed:.2f})"
                        if (usage.total_reserve_bytes_sum or usage.engine_memory_fractions)
                        and committed
                        else ""
                    ),
                    ", ".join(usage.undeclared_stages) or "-",
                    ("on" if mps.enabled else "off") + f": {mps.reason}" if mps else "-",
                ]
            )
        say("GPUs")
        say(box_table(("gpu", "memory", "stages", "shares", "undeclared", "MPS"), rows, width))
    else:
        say("GPUs: none used (every stage runs on the host)")

    for process in plan.processes:
        if process.engine_ranks:
            gpus = f"GPUs {process.gpu}..{process.gpu + process.engine_ranks - 1}"
            say(
                f"tensor parallel: {process.name} is one omni process; its SGLang engine starts "
                f"{process.engine_ranks} scheduler ranks "
                f"({gpus if process.gpu is not None else 'on the host'}, SGLang's tp_size)"
            )
    if plan.weight_share.mode == "on":
        for group in plan.weight_share.groups:
            where = "the host" if group.gpu is None else f"GPU {group.gpu}"
            counted = (
                f"; weights {format_bytes(group.weights_bytes)} counted once "
                f"({format_bytes(group.saved_bytes or 0)} saved)"
                if group.weights_bytes is not None
                else ""
            )
            say(
                f"weight sharing: {group.process} on {where} ({group.stage}): "
                f"{group.leader} leads, {', '.join(group.followers)} follow{counted}"
            )
    if len(plan.start_waves) > 1:
        waves = "; ".join(f"wave {i}: {', '.join(w)}" for i, w in enumerate(plan.start_waves))
        say(f"start-up: {waves}")
    for stage, precision in sorted(plan.precisions.items()):
        say(f"precision {stage}: {precision.describe()}")
    for stage, how in sorted(plan.decodes.items()):
        say(f"decode {stage}: {how}")
    for stage, how in sorted(plan.prefills.items()):
        say(f"prefill {stage}: {how}")
    for stage, how in sorted(plan.caches.items()):
        say(f"cache {stage}: {how}")
    for stage, estimate in sorted(plan.estimates.items()):
        say(
            f"estimate {stage}: {format_bytes(estimate.total_bytes)} (weights "
            f"{format_bytes(estimate.weights_bytes)}, KV {format_bytes(estimate.kv_bytes)}, "
            f"other {format_bytes(estimate.overhead_bytes)}; {estimate.source})"
        )
    say(
        f"admission: at most {plan.admission_limit} requests in flight (runtime.max_inflight, "
        "else the engine stages' max_running_requests x replicas)"
    )
    endpoints = plan.endpoints
    say(
        f"runtime dir: {endpoints.runtime_dir} (mode {endpoints.mode:04o}, created at launch); "
        f"{len(endpoints.processes) + len(endpoints.stages) + 1} sockets"
    )
    for note in plan.notes:
        say(f"note: {note}")
