"""Shared fixtures of the core's tests.

``plugins`` (a fresh plugin manager, ``OMNI_PLUGINS`` cleared) and
``short_tmp`` (a short private directory for runtime endpoints) come from
:mod:`omni_core.testing`, the module plugin authors load the same way; the
repository's top-level conftest loads it for every suite here.
"""

from __future__ import annotations
