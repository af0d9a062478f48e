"""Shared fixtures of the core's tests.

``plugins`` (a fresh plugin manager, ``OMNI_PLUGINS`` cleared) and
``short_tmp`` (a short private directory for runtime endpoints) come from
:mod:`omni_core.testing`, the module plugin authors load the same way; the
repository's top-level conftest loads it for every suite here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def shipped_plugins_env() -> dict[str, str]:
    """The environment with ``OMNI_PLUGINS`` naming the shipped plugins only.

    For a child process whose check a developer's own installed plugin could
    upset (a plugin may import numpy or torch at will; the shipped ones must not).
    """
    import importlib.util

    # by path: under --import-mode=importlib this directory is not on sys.path
    spec = importlib.util.spec_from_file_location(
        "installed_plugins", Path(__file__).with_name("installed_plugins.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {**os.environ, "OMNI_PLUGINS": module.ONLY_SHIPPED}
