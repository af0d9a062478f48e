"""IPC endpoints: one runtime directory per deployment, Unix sockets inside it.

The directory is ``<endpoints.base_path>/<deployment id>`` (mode 0700; the
runtime creates it and removes it on exit — planning creates nothing). The
base defaults to a directory of the user's own: ``$XDG_RUNTIME_DIR/omni``
where the session has one, else ``omni-<uid>`` in the temp directory, never a
directory shared by all users (see :mod:`omni_core.runtime.rundir`). The id
is derived from the pipeline name and a digest of the resolved config, so the
same deployment always plans the same paths and two different deployments
never share a directory. Each process gets an endpoint (control), the
coordinator one, and each stage instance that receives payloads from another
process (or from the coordinator, as the entry stage does) one more. A Unix
socket path must fit ``sun_path``: 107 bytes and a NUL.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import tempfile

from ..schema import PipelineConfig
from .model import EndpointsPlan, ProcessPlan, Refusal, StagePlacement

SOCKET_PATH_MAX = 107
"""Longest Unix socket path Linux accepts (``sizeof(sun_path)`` is 108, NUL included)."""

RUNTIME_DIR_MODE = 0o700

_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]")


def default_base_path() -> str:
    """The user's private base: ``$XDG_RUNTIME_DIR/omni``, else ``<tmp>/omni-<uid>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return posixpath.join(runtime, "omni")
    return posixpath.join(tempfile.gettempdir(), f"omni-{os.geteuid()}")


def deployment_id(config: PipelineConfig) -> str:
    """``<pipeline>-<10 hex>``: stable for one resolved config, distinct across configs."""
    digest = hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:10]
    return f"{_UNSAFE.sub('_', type(config).pipeline_name or 'pipeline')}-{digest}"


def stages_needing_endpoints(config: PipelineConfig) -> set[str]:
    """Logical stages that receive payloads across a process boundary.

    Replicas are bound sticky per request, so an edge between two stages of
    one logical process stays inside one replica's process and needs no socket.
    """
    process_of = {s.name: s.process or s.name for s in config.stages}
    needing = {type(config).entry_stage or config.stages[0].name}
    for stage in config.stages:
        for target in {*stage.targets, *stage.stream_to}:
            if process_of.get(target) != process_of[stage.name] or stage.tp_size > 1:
                needing.add(target)
        if stage.tp_size > 1:
            needing.add(stage.name)
    for stage in config.stages:
        for source in stage.wait_for or ():
            if process_of.get(source) != process_of[stage.name]:
                needing.add(stage.name)
    return needing


class _Names:
    """File-system-safe, collision-free names for sockets."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, prefix: str, name: str) -> str:
        safe = f"{prefix}-{_UNSAFE.sub('_', name)}"
        candidate, n = safe, 1
        while candidate in self.used:
            n += 1
            candidate = f"{safe}-{n}"
        self.used.add(candidate)
        return f"{candidate}.sock"


def plan_endpoints(
    config: PipelineConfig,
    processes: list[ProcessPlan],
    stages: list[StagePlacement],
    problems: list[Refusal],
) -> EndpointsPlan:
    """Socket paths for the coordinator, each process and each stage that needs one."""
    base = config.endpoints.base_path or default_base_path()
    ident = deployment_id(config)
    runtime_dir = posixpath.join(base, ident)
    names = _Names()
    plan = EndpointsPlan(
        base_path=base,
        deployment_id=ident,
        runtime_dir=runtime_dir,
        coordinator=posixpath.join(runtime_dir, names("c", "coordinator")),
        mode=RUNTIME_DIR_MODE,
    )
    if not posixpath.isabs(base):
        problems.append(
            Refusal(
                f"endpoints.base_path {base!r} is not an absolute path; sockets would depend "
                "on the directory omni is started from",
                fix=f"write an absolute path, e.g. --endpoints.base_path {default_base_path()}",
            )
        )
    for process in processes:
        path = posixpath.join(runtime_dir, names("p", process.name))
        process.endpoint = plan.processes[process.name] = path
    needing = stages_needing_endpoints(config)
    for stage in stages:
        if stage.stage in needing:
            path = posixpath.join(runtime_dir, names("s", stage.instance))
            stage.endpoint = plan.stages[stage.instance] = path
    every = [plan.coordinator, *plan.processes.values(), *plan.stages.values()]
    too_long = [p for p in every if len(p.encode()) > SOCKET_PATH_MAX]
    if too_long:
        longest = max(too_long, key=lambda p: len(p.encode()))
        over = len(longest.encode()) - SOCKET_PATH_MAX
        problems.append(
            Refusal(
                f"endpoint {longest} is {len(longest.encode())} bytes, over the Unix socket "
                f"limit of {SOCKET_PATH_MAX} bytes ({len(too_long)} of {len(every)} endpoints "
                "are too long)",
                fix=f"shorten endpoints.base_path ({len(base.encode())} bytes now) by at least "
                f"{over} bytes, e.g. --endpoints.base_path {default_base_path()}",
            )
        )
    return plan
