"""Fixtures of the runtime tests: the test pipelines, resolved and planned on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import omni_test_pipelines as tp

from omni_core.testing import plan_on_cpu


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def test_plugins(plugins):
    with plugins.registered(tp, tp.HERE):
        yield plugins


@pytest.fixture
def deployment(test_plugins, short_tmp):
    """Resolve and plan a test pipeline on the CPU under a private runtime directory."""

    def make(pipeline: str, *flags: str):
        planned = plan_on_cpu(test_plugins, short_tmp, pipeline=pipeline, flags=flags)
        return planned.runtime()

    return make
