"""Shared fixtures of the core's tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A private directory with a short path, for runtime endpoints.

    Unix socket paths must fit in 107 bytes, and pytest's ``tmp_path`` (named
    after the test, under a per-run counter) can take 60 of them by itself.
    """
    path = Path(tempfile.mkdtemp(prefix="omni-t", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
