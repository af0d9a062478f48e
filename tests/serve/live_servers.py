"""In-process servers of the test pipelines (:mod:`omni_test_speech`) for the server tests.

A module of its own, imported by name, rather than imported from
``conftest``: with several test directories collected together
(``pytest tests/serve tests/runtime``) the name ``conftest`` can resolve to
another directory's file, and the import fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import omni_test_speech as ts

from omni_core.plugins import OmniPlugins
from omni_core.testing import LiveServer, plan_on_cpu


def live_server(
    pipeline: str, flags: list[str], base: Path, api_key: str | None = None
) -> LiveServer:
    """A server of the test pipeline ``pipeline`` (registered in-process) with ``flags``."""
    plugins = OmniPlugins(env={})
    plugins.register(ts, ts.HERE)
    planned = plan_on_cpu(
        plugins, base, pipeline=pipeline, flags=flags, policy=None, plugin_modules=[ts.HERE]
    )
    return LiveServer(planned, api_key=api_key)


def running_server(pipeline: str, flags: list[str], tmp: Path, **kw: Any) -> Iterator[LiveServer]:
    """:func:`live_server` started, for a fixture to yield from; stopped when the fixture ends."""
    server = live_server(pipeline, flags, tmp, **kw).start()
    try:
        yield server
    finally:
        server.stop()
