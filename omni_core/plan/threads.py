"""The CPU core budget: how many torch (OpenMP) threads each process gets.

Why a budget: torch starts one compute thread per core in every process, so
seven stage processes on a small host would run seven times too many
threads, and the codecs' bursts (vocoder, code2wav, MOSS codec) would take
cores from the decoders, which are on every request's critical path. The
rule, unless told otherwise:

- processes that run an engine stage (the autoregressive decoders) share the
  host's cores between them: ``cores // engine processes`` each, at least 1;
- every other process (encoders, codecs, preprocessing) gets what is left,
  shared the same way, at least 1: their work is batched across requests and
  runs between decoder steps, so one thread each keeps them off the
  decoders' cores.

``runtime.cpu_threads`` gives every process that many threads instead, and
a stage's own ``env.OMP_NUM_THREADS`` (or the same variable in the
environment ``omni serve`` runs in, which the child inherits and keeps) wins
over both. The plan records the number and where it came from;
``omni plan`` prints it and the child applies it (:func:`apply_cpu_threads`).

When the processes' threads add up to more than the host's cores, each
process also gets ``GOMP_SPINCOUNT`` = :data:`SHARED_CORES_SPIN` (unless the
stage's env or the environment sets it): a stage process's compute thread
is the only OpenMP team in it (``engine/compute.py``), so its idle threads
spin between ops for OpenMP's default (300,000 turns, milliseconds), which
makes a lone process fast and, on cores shared with other processes, burns
the time they need. OpenMP reads it when torch loads, which for a forked
stage process is in the fork server: ``launchers/fork_env.py`` starts the
server with it. Measured here (2 cores, two test workers each running
deployments): 85 s with the default spin, 31 s with 1,000 turns, 33 s
before the compute thread existed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .model import ProcessPlan

THREADS_VAR = "OMP_NUM_THREADS"
SPIN_VAR = "GOMP_SPINCOUNT"
SHARED_CORES_SPIN = 1000  # OpenMP's idle-thread spin where processes share cores


def host_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def plan_cpu_threads(
    processes: Sequence[ProcessPlan],
    engine_processes: set[str],
    threads: int | None,
    *,
    cores: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Set ``cpu_threads``, ``threads_source`` and ``env[OMP_NUM_THREADS]`` of each process.

    ``engine_processes``: logical names of the processes holding an engine
    stage; ``threads``: ``runtime.cpu_threads``; ``environ``: the environment
    the children inherit (``os.environ`` by default), whose value wins.
    """
    if not processes:
        return
    cores = cores or host_cores()
    environ = os.environ if environ is None else environ
    engines = [p for p in processes if p.logical in engine_processes]
    helpers = [p for p in processes if p.logical not in engine_processes]
    engine_share = max(1, cores // len(engines)) if engines else 0
    left = cores - engine_share * len(engines)
    helper_share = max(1, left // len(helpers)) if helpers else 0
    for process in processes:
        if process.logical in engine_processes:
            number, source = engine_share, f"decoder share of {cores} cores"
        else:
            number, source = helper_share, f"helper share of {cores} cores"
        if threads is not None:
            number, source = threads, "runtime.cpu_threads"
        if THREADS_VAR in process.env:
            number, source = _parse(process.env[THREADS_VAR], number), f"stage env {THREADS_VAR}"
        elif THREADS_VAR in environ:
            number, source = _parse(environ[THREADS_VAR], number), f"environment {THREADS_VAR}"
        process.env.setdefault(THREADS_VAR, str(number))
        process.cpu_threads, process.threads_source = number, source
    if sum(p.cpu_threads or 0 for p in processes) > cores and SPIN_VAR not in environ:
        for process in processes:
            process.env.setdefault(SPIN_VAR, str(SHARED_CORES_SPIN))


def _parse(text: str, fallback: int) -> int:
    """OpenMP's own reading of the variable: the first number of a list, else the fallback."""
    head = text.split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else fallback


def apply_cpu_threads(process: Any) -> None:
    """In the child: give torch the planned thread count, if this process has torch loaded.

    The environment variable already reaches torch when it is imported after
    the child starts; this also covers a torch imported earlier (a plugin's
    import-time work), and keeps inter-op threads at one: a stage process
    runs one model call at a time, so a second pool would only compete.
    """
    number = getattr(process, "cpu_threads", None)
    torch = sys.modules.get("torch")
    if torch is None or not number:
        return
    if torch.get_num_threads() != number:
        torch.set_num_threads(number)
    # once inter-op work has started the pool's size is fixed: keep it then
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
