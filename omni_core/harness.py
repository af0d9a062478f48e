"""A deployment run in-process on the CPU: plan it, start its runtime, serve it over HTTP.

What tests and benchmarks share (:func:`plan_on_cpu`, :class:`PlannedDeployment`,
:class:`LiveServer`, :func:`short_private_dir`, :func:`local_ray_cluster`). It
imports neither pytest nor torch (nor Ray, but inside the function that starts
one): benchmarks run where pytest is not installed, and a benchmark that
needed the test runner's machinery would rot unnoticed. The pytest fixtures
over these helpers are in :mod:`omni_core.testing`, which re-exports them.

Children that the runtime spawns import in-process plugins by module name,
so :func:`plan_on_cpu` hands them over; a runtime's Unix sockets live under
``endpoints.base_path``, whose paths the kernel limits to 107 bytes
(:func:`short_private_dir`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .plugins import OmniPlugins
from .sigterm import signal_handlers_kept

if TYPE_CHECKING:
    from .config import Resolution
    from .plan.model import DeploymentPlan
    from .runtime import Runtime
    from .schema import PipelineConfig

__all__ = [
    "LiveServer",
    "PlannedDeployment",
    "local_ray_cluster",
    "plan_on_cpu",
    "short_private_dir",
]


@contextmanager
def short_private_dir(prefix: str = "omni-t") -> Iterator[Path]:
    """A fresh directory with a short path, readable by this user only; removed on exit.

    Use it as ``endpoints.base_path``: the runtime directory and its Unix
    sockets go under it, and socket paths must fit in 107 bytes (Ray's too,
    several levels down a cluster's session). Under ``/tmp``: TMPDIR can be
    long (macOS). Where ``OMNI_TEST_RUN_ROOT`` names a test run's own directory
    (omni's suite sets it), the directory is also listed there, so that the
    run removes it should this process end before its ``finally`` runs.
    """
    root = "/tmp" if os.path.isdir("/tmp") else None
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))  # mode 0700
    listed = _list_for_the_run(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if listed is not None:
            listed.unlink(missing_ok=True)


#: Where a test run lists the directories ``short_private_dir`` made outside its own.
RUN_LIST = "short-dirs"


def _list_for_the_run(path: Path) -> Path | None:
    run_root = os.environ.get("OMNI_TEST_RUN_ROOT")
    if not run_root or not os.path.isdir(run_root):
        return None
    listed = Path(run_root, RUN_LIST, path.name)
    listed.parent.mkdir(exist_ok=True)
    listed.write_text(str(path))
    return listed


def remove_listed_dirs(run_root: str) -> None:
    """Remove what ``short_private_dir`` listed under ``run_root`` and did not remove
    itself (its process ended first), then ``run_root``: a test run's last act."""
    listing = Path(run_root, RUN_LIST)
    if listing.is_dir():
        for entry in listing.iterdir():
            made = entry.read_text()
            if os.path.dirname(made) in ("/tmp", tempfile.gettempdir()):  # never elsewhere
                shutil.rmtree(made, ignore_errors=True)
    shutil.rmtree(run_root, ignore_errors=True)


#: The file in a test run's directory that names the process owning it (its pid).
RUN_OWNER = "owner"

#: How old a run's directory without an owner file must be before another run removes it:
#: its owner may be between making it and writing the file.
UNOWNED_GRACE_SECONDS = 600.0


def remove_stale_run_roots(parent: str, prefix: str = "omni-run-") -> list[str]:
    """Remove the test runs' directories under ``parent`` whose owner is gone; which.

    Why: a run removes its own directory when its main process ends, which a
    process killed outright (SIGKILL, a machine's CI stopped from outside)
    never does, and its directory, with the short directories listed in it,
    stayed. The next run removes them: a directory whose owner's pid no
    longer runs, or one without an owner file older than
    :data:`UNOWNED_GRACE_SECONDS`. Only this user's directories.
    """
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            owner = Path(entry.path, RUN_OWNER)
            if owner.exists():
                stale = not _pid_runs(int(owner.read_text().strip() or 0))
            else:
                age = time.time() - entry.stat(follow_symlinks=False).st_mtime
                stale = age > UNOWNED_GRACE_SECONDS
        except (OSError, ValueError):
            continue
        if stale:
            remove_listed_dirs(entry.path)
            removed.append(entry.path)
    return removed


def _pid_runs(pid: int) -> bool:
    """Whether a process ``pid`` runs (another user's too: it cannot be signalled); a
    killed one its parent has not reaped yet (a zombie) does not."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # Linux: the state follows the command's closing parenthesis
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


@contextmanager
def local_ray_cluster(head: dict[str, Any], *workers: dict[str, Any]) -> Iterator[Any]:
    """A Ray cluster on this machine (``ray.cluster_utils.Cluster``): a head node started
    with ``head`` and one node per ``workers`` entry; shut down on exit.

    Its daemons run under a private ``TMPDIR``, removed after them: Ray keeps a
    cluster's session under ``$TMPDIR/ray`` and never removes it, and a
    dashboard's fork server leaves its socket directory (``$TMPDIR/pymp-*``)
    when Ray kills it. This process keeps its own temporary directory:
    ``tempfile`` reads the variable once, and reads it here before the change.
    """
    from unittest import mock

    from ray.cluster_utils import Cluster

    tempfile.gettempdir()
    with short_private_dir("omni-ray-") as scratch:
        # kept: Ray's nodes set a SIGTERM handler of their own; this process's stays, and
        # shuts the cluster down below when SIGTERM unwinds it (omni_core.sigterm)
        with mock.patch.dict(os.environ, {"TMPDIR": str(scratch)}), signal_handlers_kept():
            cluster = Cluster(initialize_head=True, head_node_args=head)
            try:
                for worker in workers:
                    cluster.add_node(**worker)
                cluster.wait_for_nodes()
            except BaseException:
                cluster.shutdown()
                raise
        try:
            yield cluster
        finally:
            cluster.shutdown()


@dataclass
class PlannedDeployment:
    """A resolved and planned deployment, ready to start as a :class:`Runtime`."""

    resolution: Resolution
    plan: DeploymentPlan
    plugins: OmniPlugins
    plugin_modules: list[str] = field(default_factory=list)

    @property
    def config(self) -> PipelineConfig:
        return self.resolution.config

    def runtime(self, **options: Any) -> Runtime:
        """A runtime, not yet started: ``async with planned.runtime() as rt: ...``."""
        from .runtime import Runtime

        return Runtime(
            self.plan,
            self.config,
            plugins=self.plugins,
            plugin_modules=self.plugin_modules,
            **options,
        )

    def run(self, data: Any, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start the runtime, run one request, stop it; the terminal stages' outputs by name.

        Synchronous, for plain tests: it runs its own event loop, so call
        :meth:`runtime` from an async test instead. The request is bounded by
        ``runtime.request_timeout``; start-up by the runtime's own limits.
        """
        import anyio

        async def one() -> dict[str, Any]:
            async with self.runtime() as runtime:
                return await runtime.run(data, params)

        return anyio.run(one)

    def serve(self, api_key: str | None = None) -> LiveServer:
        """A live HTTP server of this deployment, started: ``with planned.serve() as server:``."""
        return LiveServer(self, api_key=api_key).start()


class LiveServer:
    """``omni serve`` minus the command line: runtime, app and uvicorn on a free port.

    It runs on its own event loop in a thread, so plain (synchronous) tests
    can talk to it over HTTP, e.g. with the official ``openai`` client
    (:meth:`client`). Use it as a context manager, or call :meth:`stop`.
    """

    def __init__(self, planned: PlannedDeployment, api_key: str | None = None):
        import threading

        self.planned, self.api_key = planned, api_key
        self.url = ""
        self.runtime: Any = None
        self.server: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        name = f"server-{planned.config.pipeline_name}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, timeout: float = 120) -> LiveServer:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the test server did not start in {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        import anyio

        try:
            anyio.run(self._main)
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        from .serve.common.app import create_app
        from .serve.server import bind, make_server, serve_runtime

        config = self.planned.config
        self.runtime = self.planned.runtime()
        async with self.runtime:
            app = create_app(self.runtime, self.planned.resolution, api_key=self.api_key)
            self.server = make_server(
                app,
                "",
                0,
                grace=1,
                header_timeout=config.server.header_timeout,
                body_timeout=config.server.body_timeout,
            )

            def started(urls: list[str]) -> None:
                self.url = urls[0]
                self._ready.set()

            await serve_runtime(self.server, [bind("127.0.0.1", 0)], on_started=started)

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self._thread.join(30)

    def client(self, api_key: str | None = "unused", timeout: float = 60) -> Any:
        """An ``openai.OpenAI`` client for this server (no retries)."""
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=timeout)

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def plan_on_cpu(
    plugins: OmniPlugins,
    base_path: str | os.PathLike[str],
    *,
    pipeline: str | None = None,
    deploy: str | os.PathLike[str] | None = None,
    flags: Iterable[str] = (),
    policy: str | None = "cpu",
    plugin_modules: Iterable[str] | None = None,
) -> PlannedDeployment:
    """Resolve and plan a deployment without GPUs, its runtime directory under ``base_path``.

    ``pipeline`` and/or ``deploy`` (a deploy file) say what to deploy, and
    ``flags`` are command-line settings (``"--shout.factory.suffix", "?"``),
    exactly as ``omni plan`` takes them. ``policy`` picks the placement policy
    (default ``cpu``: every stage off the GPU); ``None`` keeps the deployment's
    own. GPUs are never detected: the plan uses what ``[cluster]`` declares, so
    it is the same on every machine. ``plugin_modules`` (what the children
    import by name) defaults to ``plugins.in_process_modules()``.
    """
    from .config import load_deployment
    from .plan import plan_deployment

    chosen = ["--placement.policy", policy] if policy else []
    resolution = load_deployment(
        None if deploy is None else str(deploy),
        [*chosen, "--endpoints.base_path", str(base_path), *flags],
        pipeline=pipeline,
        plugins=plugins,
    )
    plan = plan_deployment(resolution.config, plugins=plugins)
    modules = plugins.in_process_modules() if plugin_modules is None else list(plugin_modules)
    return PlannedDeployment(resolution, plan, plugins, modules)
