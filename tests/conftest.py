"""Shared fixtures of the core's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from omni_core.plugins import ENV_VAR, OmniPlugins, reset_plugins


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
