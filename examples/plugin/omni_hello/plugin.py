"""Step 5: the entry point. omni finds this module through the ``omni`` entry-point group."""

from __future__ import annotations

from omni_core import hookimpl


@hookimpl
def omni_register_pipelines():
    from .pipeline import HelloPipeline

    return [HelloPipeline]


@hookimpl
def omni_register_placement_policies():
    from .policy import SpreadReplicas

    return [SpreadReplicas()]


@hookimpl
def omni_register_transports():
    from .transport import TracedTransport

    return [TracedTransport()]
