"""The built-in placement policies, registered like any plugin's."""

from __future__ import annotations

from ..hookspecs import hookimpl


@hookimpl
def omni_register_placement_policies() -> list:
    from ..plan.policies import BUILTIN_POLICIES

    return [policy() for policy in BUILTIN_POLICIES]
