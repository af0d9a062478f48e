"""A developer's own plugin, installed next to the shipped ones, cannot fail the suite.

The tests that list or load every installed plugin compare against the shipped
distributions only (tests/installed_plugins.py). Proved here for real: a
throw-away distribution with a pipeline and a placement policy (as written from
CONTRIBUTING.md) is made visible to entry-point discovery by a ``*.dist-info``
on a child's ``PYTHONPATH``, no pip involved, and those tests run in that child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The tests that list every installed plugin (and the one that loads them all).
LISTING_TESTS = ["tests/test_plugins.py", "tests/test_cli_plugins.py", "tests/test_imports.py"]

PLUGIN = """
from typing import ClassVar

import numpy  # a plugin may import what it likes; the shipped ones must not

from omni_core import PipelineConfig, PlacementPolicy, StageConfig, hookimpl
from omni_core.placement import PlacementResult


class EchoPipeline(PipelineConfig):
    pipeline_name: ClassVar[str] = "echo"
    description: ClassVar[str] = "echoes its input"
    entry_stage: ClassVar[str] = "echo"

    @classmethod
    def default_stages(cls):
        return [StageConfig(name="echo", factory_path="x.y:z", terminal=True, process="p")]


class LastGpu(PlacementPolicy):
    name = "last-gpu"
    description = "everything on the last GPU"

    def place(self, request):
        return PlacementResult()


@hookimpl
def omni_register_pipelines():
    return [EchoPipeline]


@hookimpl
def omni_register_placement_policies():
    return [LastGpu()]
"""


def install_throwaway_plugin(where: Path) -> None:
    """``omni-lastgpu``, as ``pip install`` would leave it, under ``where``."""
    info = where / "omni_lastgpu-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: omni-lastgpu\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[omni]\nlastgpu = omni_lastgpu_plugin\n")
    (where / "omni_lastgpu_plugin.py").write_text(PLUGIN)


def test_a_developers_own_installed_plugin_does_not_fail_the_listing_tests(tmp_path: Path) -> None:
    install_throwaway_plugin(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in {"OMNI_PLUGINS", "PYTEST_ADDOPTS"}}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    # The plugin really is installed, as far as omni can tell ...
    listed = subprocess.run(
        [sys.executable, "-m", "omni_core", "plugins", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)["plugins"]}
    assert rows["omni-lastgpu"]["pipelines"] == ["echo"]
    assert rows["omni-lastgpu"]["placement_policies"] == ["last-gpu"]
    assert rows["omni-lastgpu"]["error"] is None
    # ... and the tests that list the installed plugins still pass.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            *LISTING_TESTS,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
