"""Test helpers for plugin authors (and the core's own tests): fixtures and a CPU runtime.

Load it as a pytest plugin from your ``conftest.py``::

    pytest_plugins = ["omni_core.testing"]

and your tests get the ``plugins`` and ``short_tmp`` fixtures. The plain
helpers (:func:`plan_on_cpu`, :class:`PlannedDeployment`, :class:`LiveServer`,
:func:`short_private_dir`) live in :mod:`omni_core.harness`, which needs no
pytest (benchmarks use it), and are re-exported here. This module needs
pytest (it is for test suites) and never imports torch.

Why these exist: a plugin's tests must not see what another test registered
or what the developer's shell sets in ``OMNI_PLUGINS`` (``plugins``), and a
runtime's Unix sockets live under ``endpoints.base_path``, whose paths the
kernel limits to 107 bytes, which pytest's ``tmp_path`` alone can eat most of
(``short_tmp``). Children that the runtime spawns import in-process plugins
by module name, so :func:`plan_on_cpu` hands them over.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import (
    LiveServer,
    PlannedDeployment,
    local_ray_cluster,
    plan_on_cpu,
    short_private_dir,
)
from .plugins import ENV_VAR, OmniPlugins, reset_plugins

__all__ = [
    "LiveServer",
    "PlannedDeployment",
    "local_ray_cluster",
    "plan_on_cpu",
    "plugins",
    "short_private_dir",
    "short_tmp",
]


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[OmniPlugins]:
    """A fresh plugin manager over every installed plugin.

    ``OMNI_PLUGINS`` is cleared so the caller's shell cannot change what loads,
    and the process-wide manager is reset on both sides so that no test sees
    plugins another test registered.
    """
    monkeypatch.delenv(ENV_VAR, raising=False)
    reset_plugins()
    try:
        yield OmniPlugins()
    finally:
        reset_plugins()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A private directory with a short path, for runtime endpoints.

    Unix socket paths must fit in 107 bytes, and pytest's ``tmp_path`` (named
    after the test, under a per-run counter) can take 60 of them by itself.
    """
    with short_private_dir() as path:
        yield path
