"""The built-in transports, registered like any plugin's."""

from __future__ import annotations

from ..hookspecs import hookimpl


@hookimpl
def omni_register_transports() -> list:
    from ..runtime.transports import BUILTIN_TRANSPORTS

    return [transport() for transport in BUILTIN_TRANSPORTS]
