"""The quick benchmarks in ``--smoke`` mode, and the checks of the smoke runs themselves.

Every script no other module of this directory takes runs here (a new one
too), each in a fresh interpreter with pytest unimportable: see conftest.py.
"""

from __future__ import annotations

import subprocess
import sys

GROUP = "light"


def test_benchmark_smoke(run_smoke, benchmark: str) -> None:
    run_smoke(benchmark).check()


def test_pytest_is_really_unimportable_in_the_smoke_runs(no_pytest_path, shipped_plugins_env):
    """The guard itself: a script that imports pytest fails under it."""
    env = {**shipped_plugins_env, "PYTHONPATH": str(no_pytest_path)}
    done = subprocess.run(
        [sys.executable, "-c", "import omni_core.harness; import pytest"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "a benchmark must not import pytest" in done.stderr


def test_the_harness_imports_without_pytest_and_testing_re_exports_it(
    no_pytest_path, shipped_plugins_env
):
    """Benchmarks use omni_core.harness; omni_core.testing (pytest's side) is the same objects."""
    env = {**shipped_plugins_env, "PYTHONPATH": str(no_pytest_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from omni_core.harness import plan_on_cpu, LiveServer; print('ok')",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    import omni_core.harness as harness
    import omni_core.testing as testing

    for name in ("LiveServer", "PlannedDeployment", "plan_on_cpu", "short_private_dir"):
        assert getattr(testing, name) is getattr(harness, name)
