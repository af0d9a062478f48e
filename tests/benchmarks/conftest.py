"""Every benchmark runs in its ``--smoke`` mode, so that none can rot unnoticed.

The scripts are found by glob (``benchmarks/bench_*.py``, plus ``soak.py`` and
``gpu_check.py``): a new benchmark is run without anyone listing it, and one
without ``--smoke`` fails (argparse exits 2). The test modules of this
directory each take one group of them (``GROUP``), so that pytest-xdist, which
keeps a module on one worker (``--dist loadfile``), spreads the slow ones;
a script no group names falls into ``light``.

Each script runs with pytest made unimportable (a directory first on
``PYTHONPATH`` whose ``pytest`` and ``_pytest`` raise ImportError, inherited
by every process the script starts): a benchmark must run where only the
package is installed. It runs in a fork of an interpreter that has imported
torch alone (``smoke_zygote.py``, one per test worker), as omni's stage
processes are forks of its fork server: 1.2-1.5 s less a run than a fresh
interpreter, some 30 runs a ``make test``. A run that must keep pytest
importable (``block=False``) starts a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from omni_core.sigterm import run_child

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
# Scripts that are not named bench_*.py but take --smoke too.
EXTRA = ("soak.py", "gpu_check.py")
# Which test module runs which script; every other script runs in "light".
GROUPS = {
    "bench_qwen3_omni_speech.py": "served",
    "bench_realtime.py": "served",
    "bench_ws_speech.py": "served",
    "bench_thinker_backends.py": "served",
    "bench_ray_transport.py": "processes",
    "soak.py": "processes",
    "bench_weight_share.py": "processes",
    "gpu_check.py": "gpu_check",
    "bench_compile_start.py": "start",
    "bench_startup.py": "start",
}
# What each script's figures look like, beyond the generic check (a decimal number).
FIGURES = {
    "bench_qwen3_tts.py": "RTF",
    "bench_moss_tts.py": "BENCH_JSON",
    "bench_qwen3_omni_thinker.py": "tokens/s",
    "bench_qwen3_omni_speech.py": "first audio s",
    "bench_qwen3_asr.py": "audio s / wall s",
    "bench_engine.py": "tokens/s",
    "bench_transport.py": "ratio shm / memcpy",
    "bench_ray_transport.py": "cross-node tcp",
    "bench_realtime.py": "speech_stopped",
    "bench_ws_speech.py": "first audio",
    "bench_thinker_backends.py": "torch",
    "bench_runtime.py": "req/s",
    "bench_plan.py": "us/instance",
    "bench_cli.py": "x floor",
    "bench_cpu_linear.py": "GB/s",
    "bench_cpu_kernel_survey.py": "relative error against the float64 product",
    "bench_weight_share.py": "total PSS",
    "soak.py": "soak: PASS",
    "gpu_check.py": "throughput",
    "bench_startup.py": "ratio spawn / forkserver",
}
# Scripts that need a program this machine may lack: their smoke run skips, saying
# which, as the tests that need it do (the README names the apt packages).
NEEDS = {"bench_realtime.py": "espeak-ng"}
# Smoke runs left to ``make test-all`` (--slow): a local Ray cluster's start is most of
# bench_ray_transport's 25 s here, and tests/serve/test_ray_launcher.py starts one already.
SLOW = {"bench_ray_transport.py"}
# Smoke runs a named test of test_smoke_light.py makes too, with flags that only add to
# them (--rounds 2: the same run twice, each round checked): the plain run is left to
# make test-all.
COVERED = {
    "bench_qwen3_tts.py": "test_the_qwen3_tts_sides_alternate_and_each_keeps_its_fastest_round",
    "bench_qwen3_omni_thinker.py": "test_the_thinker_benchmark_keeps_each_levels_fastest_round",
}
# Flags a smoke run adds: bench_compile_start compiles against the suite's inductor cache
# (conftest.py keeps torch's own) instead of a new empty one, 20 s of CPU less a run
# from the second on; the script's path is the same.
SMOKE_FLAGS = {
    "bench_compile_start.py": lambda: ["--cache-dir", os.environ["TORCHINDUCTOR_CACHE_DIR"]],
}
BLOCKED = "pytest is blocked here: a benchmark must not import pytest (tests/benchmarks)"


def scripts() -> list[str]:
    """Every benchmark script's file name, sorted."""
    found = {p.name for p in BENCHMARKS.glob("bench_*.py")}
    found.update(name for name in EXTRA if (BENCHMARKS / name).is_file())
    return sorted(found)


def group_of(name: str) -> str:
    return GROUPS.get(name, "light")


@contextlib.contextmanager
def loaded_script(filename: str) -> Iterator[ModuleType]:
    """``benchmarks/FILENAME`` imported by path, its sibling helpers importable as it
    imports them; unloaded after (for a module-scoped fixture of a test module)."""
    name = filename.removesuffix(".py") + "_under_test"
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))
        sys.modules.pop(name, None)


@pytest.fixture(scope="session")
def load_script() -> Any:
    """:func:`loaded_script`, for the test modules' own module-scoped fixtures."""
    return loaded_script


@pytest.fixture(scope="session")
def no_pytest_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that, first on ``PYTHONPATH``, makes ``import pytest`` fail."""
    root = tmp_path_factory.mktemp("no-pytest")
    for name in ("pytest", "_pytest"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError({BLOCKED!r})\n")
    return root


@dataclass
class Ran:
    name: str
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> None:
        """Exit 0, figures printed, nothing skipped."""
        said = f"{self.name}:\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"
        assert self.returncode == 0, said
        assert BLOCKED not in self.stderr, said
        assert re.search(r"\d+\.\d+", self.stdout), f"no figures printed by {said}"
        assert not re.search(r"^skipped", self.stdout, re.MULTILINE), said
        assert FIGURES.get(self.name, "") in self.stdout, said


def smoke_env(shipped_plugins_env: dict[str, str], no_pytest_path: Path, block: bool):
    env = dict(shipped_plugins_env)
    path = [str(no_pytest_path)] if block else []
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST"):  # the latter names each test
        env.pop(name, None)
    return env


#: Seconds a smoke run may take: a hang fails (--smoke runs take seconds, see the README).
SMOKE_TIMEOUT = 1200


class Zygote:
    """``smoke_zygote.py``, started on first use: runs a script in a fork of itself."""

    def __init__(self, env: dict[str, str], workdir: Path):
        self.env, self.workdir, self.runs = env, workdir, 0
        self.process: subprocess.Popen[str] | None = None

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        if self.process is None:
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("smoke_zygote.py"))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
                env=self.env,
            )
        self.runs += 1
        out, err = self.workdir / f"{self.runs}.out", self.workdir / f"{self.runs}.err"
        request = {"argv": argv, "cwd": str(REPO), "stdout": str(out), "stderr": str(err)}
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        pid = json.loads(self.process.stdout.readline())["pid"]
        try:
            code = self._returncode(SMOKE_TIMEOUT)
        except BaseException:  # a hang, or this suite stopped: the run cleans up first
            os.kill(pid, signal.SIGTERM)
            try:
                self._returncode(30)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._returncode(None)
            raise
        return code, out.read_text(errors="replace"), err.read_text(errors="replace")

    def _returncode(self, timeout: float | None) -> int:
        assert self.process is not None and self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"a smoke run took over {timeout} s")
        return int(json.loads(self.process.stdout.readline())["returncode"])

    def close(self) -> None:
        if self.process is not None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(30)


@pytest.fixture(scope="session")
def covered_scripts() -> dict[str, str]:
    """:data:`COVERED`, for the test that checks it (this directory is not importable)."""
    return dict(COVERED)


@pytest.fixture(scope="session")
def zygote_type() -> type[Zygote]:
    """:class:`Zygote`, for its own test (this directory is not importable by name)."""
    return Zygote


@pytest.fixture(scope="session")
def smoke_zygotes(tmp_path_factory) -> Iterator[dict[tuple, Zygote]]:
    """One zygote per environment a run asks for (in practice one a worker)."""
    zygotes: dict[tuple, Zygote] = {}
    try:
        yield zygotes
    finally:
        for zygote in zygotes.values():
            zygote.close()


@pytest.fixture
def run_smoke(no_pytest_path: Path, shipped_plugins_env: dict[str, str], smoke_zygotes, request):
    """Run ``benchmarks/NAME --smoke [ARGS]`` with pytest unimportable (``block=True``)."""

    def run(name: str, *args: str, block: bool = True) -> Ran:
        argv = [str(BENCHMARKS / name), "--smoke", *smoke_flags(name), *args]
        if block:
            env = smoke_env(shipped_plugins_env, no_pytest_path, block)
            key = tuple(sorted(env.items()))
            if key not in smoke_zygotes:
                workdir = request.getfixturevalue("tmp_path_factory").mktemp("smoke-runs")
                smoke_zygotes[key] = Zygote(env, workdir)
            return Ran(name, *smoke_zygotes[key].run(argv))
        # run_child: a run stopped early (a hang, or this suite terminated) still gets
        # to remove what it made, where subprocess.run would kill it at once
        done = run_child(
            [sys.executable, *argv],
            cwd=REPO,
            env=smoke_env(shipped_plugins_env, no_pytest_path, block),
            timeout=SMOKE_TIMEOUT,
        )
        return Ran(name, done.returncode, done.stdout, done.stderr)

    return run


def smoke_flags(name: str) -> list[str]:
    flags = SMOKE_FLAGS.get(name)
    return flags() if flags is not None else []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``benchmark``: the scripts of the requesting module's ``GROUP``."""
    if "benchmark" in metafunc.fixturenames:
        group = metafunc.module.GROUP
        names = [name for name in scripts() if group_of(name) == group]
        params = [pytest.param(name, marks=_needs(name)) for name in names]
        metafunc.parametrize("benchmark", params, ids=[n.removesuffix(".py") for n in names])


def _needs(name: str) -> list[pytest.MarkDecorator]:
    marks = [pytest.mark.slow] if name in SLOW or name in COVERED else []
    program = NEEDS.get(name)
    if program is None:
        return marks
    missing = shutil.which(program) is None
    reason = f"{name} needs {program}, which is not installed (apt-get install {program})"
    return [*marks, pytest.mark.skipif(missing, reason=reason)]
