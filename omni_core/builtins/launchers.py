"""The built-in launchers, registered like any plugin's (implementations load on use)."""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..launcher import LazyLauncher

MODULE = "omni_core.runtime.launchers"


@hookimpl
def omni_register_launchers() -> list[LazyLauncher]:
    return [
        LazyLauncher(
            "local", f"{MODULE}.local:LocalLauncher", "child processes of omni serve, one host"
        ),
        LazyLauncher(
            "ray",
            f"{MODULE}.ray:RayLauncher",
            "actors on a Ray cluster, one placement group (pip install omni-core[ray])",
        ),
    ]
