"""torch.profiler summed up for a benchmark's log: what waits for the GPU, and what takes its time.

Why: a lent GPU comes for minutes at a time (``benchmarks/gpu_check.py``), so a
throughput table alone leaves the next session guessing where a slow frame
went. One profiled pass of a level says it in a few lines: kernel launches,
CUDA graph replays, host waits (synchronisations) and copies per engine step,
then the operators that took the most device time (on the CPU: host time).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile

#: CUDA runtime calls, by what they mean for a step (names as the profiler records them).
KINDS = {
    "kernel launches": (
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
    ),
    "graph replays": ("cudaGraphLaunch",),
    "host waits": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"),
    "copies": ("cudaMemcpyAsync", "cudaMemcpy"),
}


@contextlib.contextmanager
def profiled(device: torch.device) -> Iterator[Any]:
    """A profiler over the block, every thread's operators (the engine computes on its own)."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    # The engine's steps run on its compute thread, which a profiler started here does
    # not see unless told to record every thread (torch 2.7 and later; an older torch
    # records this thread alone, and the summary then shows little).
    try:
        config = _ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        config = _ExperimentalConfig()
    with profile(activities=activities, experimental_config=config) as prof:
        yield prof
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def summary(prof: Any, steps: int, device: torch.device, rows: int = 12) -> str:
    """Counts per engine step, then the top operators by self device (or host) time."""
    events = prof.key_averages()
    per_step = []
    for kind, names in KINDS.items():
        count = sum(e.count for e in events if e.key in names)
        per_step.append(f"{count / max(steps, 1):.1f} {kind}")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = events.table(sort_by=sort, row_limit=rows, max_name_column_width=48)
    return f"per engine step ({steps} steps): " + ", ".join(per_step) + "\n" + table
