"""Fixtures of the runtime tests: the test pipelines, resolved and planned on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import omni_test_pipelines as tp

from omni_core.config import load_deployment
from omni_core.plan.planner import plan_deployment
from omni_core.runtime import Runtime


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
        resolution = load_deployment(
            None,
            ["--placement.policy", "cpu", "--endpoints.base_path", str(short_tmp), *flags],
            pipeline=pipeline,
            plugins=test_plugins,
        )
        plan = plan_deployment(resolution.config, plugins=test_plugins)
        return Runtime(plan, resolution.config, plugins=test_plugins, plugin_modules=[tp.HERE])

    return make
