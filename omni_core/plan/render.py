"""The plan as people read it: tables of processes and GPUs, then the rest.

rich is imported here, lazily, so planning itself (and ``--json``) never pays
for it.
"""

from __future__ import annotations

from typing import IO, Any

from ..schema.sizes import format_bytes
from .model import DeploymentPlan


def _share(fraction: float | None, reserve: int | None) -> str:
    parts = []
    if fraction is not None:
        parts.append(f"{fraction:.2f}")
    if reserve is not None:
        parts.append(format_bytes(reserve))
    return " + ".join(parts) or "-"


def _where(process: Any) -> str:
    """``GPU 1``; on a multi-node plan ``b: GPU 0`` (the node, and the GPU's id there)."""
    if process.node is None:
        return "CPU" if process.gpu is None else f"GPU {process.gpu}"
    return f"{process.node}: " + ("CPU" if process.gpu is None else f"GPU {process.node_gpu}")


def render_plan(
    plan: DeploymentPlan, file: IO[str] | None = None, width: int | None = None
) -> None:
    """Print ``plan`` to ``file`` (stdout by default)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file, width=width or 120, soft_wrap=False, highlight=False)
    console.print(
        f"[bold]{plan.pipeline}[/bold]  model {plan.model_path or '-'}  "
        f"placement policy [bold]{plan.policy}[/bold]",
        markup=True,
    )
    console.print(f"GPUs: {plan.inventory.describe()}", markup=False)

    processes = Table(title="processes", title_justify="left")
    for column in ("process", "where", "stages", "replica", "tp rank", "share", "start"):
        processes.add_column(column, overflow="fold")
    for process in plan.processes:
        processes.add_row(
            process.name,
            _where(process),
            ", ".join(process.stages),
            f"{process.replica}/{process.num_replicas}" if process.num_replicas > 1 else "-",
            "-" if process.tp_rank is None else f"{process.tp_rank}/{process.tp_size}",
            _share(process.gpu_memory_fraction, process.total_reserve_bytes),
            f"wave {process.start_wave}"
            + (f" ({process.weight_share})" if process.weight_share != "none" else ""),
        )
    console.print(processes)

    if plan.gpus:
        gpus = Table(title="GPUs", title_justify="left")
        for column in ("gpu", "memory", "stages", "shares", "undeclared", "MPS"):
            gpus.add_column(column, overflow="fold")
        for gpu, usage in plan.gpus.items():
            committed = usage.committed
            mps = plan.mps.gpus.get(gpu)
            gpus.add_row(
                str(gpu),
                format_bytes(usage.memory_bytes) if usage.memory_bytes else "?",
                ", ".join(usage.stages),
                f"{usage.gpu_memory_fraction_sum:.2f}"
                + (
                    f" + {format_bytes(usage.total_reserve_bytes_sum)}"
                    if usage.total_reserve_bytes_sum
                    else ""
                )
                + (f" (= {committed:.2f})" if usage.total_reserve_bytes_sum and committed else ""),
                ", ".join(usage.undeclared_stages) or "-",
                ("on" if mps.enabled else "off") + f": {mps.reason}" if mps else "-",
            )
        console.print(gpus)
    else:
        console.print("GPUs: none used (every stage runs on the host)")

    if plan.weight_share.mode == "on":
        for group in plan.weight_share.groups:
            console.print(
                f"weight sharing: {group.process} on GPU {group.gpu} ({group.stage}): "
                f"{group.leader} leads, {', '.join(group.followers)} follow",
                markup=False,
            )
    if len(plan.start_waves) > 1:
        waves = "; ".join(f"wave {i}: {', '.join(w)}" for i, w in enumerate(plan.start_waves))
        console.print(f"start-up: {waves}", markup=False)
    for stage, estimate in sorted(plan.estimates.items()):
        console.print(
            f"estimate {stage}: {format_bytes(estimate.total_bytes)} (weights "
            f"{format_bytes(estimate.weights_bytes)}, KV {format_bytes(estimate.kv_bytes)}, "
            f"other {format_bytes(estimate.overhead_bytes)}; {estimate.source})",
            markup=False,
        )
    console.print(
        f"admission: at most {plan.admission_limit} requests in flight (runtime.max_inflight, "
        "else the engine stages' max_running_requests x replicas)",
        markup=False,
    )
    endpoints = plan.endpoints
    console.print(
        f"runtime dir: {endpoints.runtime_dir} (mode {endpoints.mode:04o}, created at launch); "
        f"{len(endpoints.processes) + len(endpoints.stages) + 1} sockets",
        markup=False,
    )
    for note in plan.notes:
        console.print(f"note: {note}", markup=False)
