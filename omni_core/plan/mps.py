"""MPS: whether each GPU runs its client processes under NVIDIA's Multi-Process Service.

Without MPS the processes on one GPU time-slice; with it they run kernels
concurrently. ``mps = "auto"`` uses it where two or more processes share a
GPU, ``on`` on every GPU with a client, ``off`` nowhere. The decision and its
reason are planned here; the runtime starts and stops the daemon.
"""

from __future__ import annotations

from collections.abc import Mapping

from .inventory import MPS_CONTROL
from .model import GpuInventory, GpuPlan, MpsDecision, MpsPlan, Refusal


def plan_mps(
    mode: str,
    gpus: Mapping[int, GpuPlan],
    inventory: GpuInventory,
    problems: list[Refusal],
) -> MpsPlan:
    plan = MpsPlan(mode=mode)
    absent = inventory.mps_available is False
    for gpu, usage in gpus.items():
        clients = list(usage.processes)
        n = len(clients)
        named = f"{n} client process{'es' if n != 1 else ''} ({', '.join(clients)})"
        if mode == "off":
            plan.gpus[gpu] = MpsDecision(False, clients, "mps = off")
        elif mode == "on":
            plan.gpus[gpu] = MpsDecision(True, clients, f"mps = on: {named}")
        elif n >= 2 and absent:
            plan.gpus[gpu] = MpsDecision(
                False, clients, f"{named} would share it under MPS, but {MPS_CONTROL} is absent"
            )
        elif n >= 2:
            plan.gpus[gpu] = MpsDecision(True, clients, f"{named} share it")
        else:
            plan.gpus[gpu] = MpsDecision(False, clients, f"{named}: nothing to share")
    enabled = [g for g, d in plan.gpus.items() if d.enabled]
    if mode == "on" and absent:
        problems.append(
            Refusal(
                f"mps = on, but {MPS_CONTROL} is not on PATH ({inventory.describe()})",
                fix="install the NVIDIA MPS tools, set mps = auto or off, or declare the target "
                "machine's with [cluster] mps_available = true",
            )
        )
    elif mode == "auto" and absent and any(len(d.clients) >= 2 for d in plan.gpus.values()):
        plan.notes.append(f"mps = auto: {MPS_CONTROL} is absent; GPUs run without MPS")
    if enabled and inventory.mps_available is None:
        plan.notes.append(
            f"whether {MPS_CONTROL} is installed is unknown; the runtime checks before starting it"
        )
    return plan
