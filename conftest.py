"""Suite-wide test options: slow end-to-end cases run only when asked for.

``make test`` (and CI) runs a representative set in a few minutes; the cases
marked ``slow`` (many processes started several times over) run with
``--slow`` or ``OMNI_SLOW_TESTS=1`` (``make test-all``), before an issue is
called done.
"""

from __future__ import annotations

import atexit
import getpass
import multiprocessing.util
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from omni_core.harness import RUN_OWNER, remove_listed_dirs, remove_stale_run_roots
from omni_core.sigterm import unwind_on_sigterm

# The suite runs workers side by side on the same cores, each starting stage processes:
# their OpenMP threads spin briefly between ops, as a plan does for processes that share
# the cores (omni_core/plan/threads.py; OpenMP's default spin made the suite 2.5x slower).
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

# A run stopped by a time limit (timeout, CI) gets SIGTERM, which would end each process on
# the spot and leave its temporary directories, sockets and logs: here it unwinds as Ctrl-C
# does, pytest tears the fixtures down and atexit runs, in the workers as in the main process.
# The main process sends it on to its xdist workers: one that started a Ray head node leads
# a process group of its own (Ray's reaper calls setpgrp), out of reach of timeout's signal.
unwind_on_sigterm(forward_to_children="PYTEST_XDIST_WORKER" not in os.environ)
_SIGTERM_HANDLER = signal.getsignal(signal.SIGTERM)

# Everything a run makes in the temporary directory goes under one directory of its own,
# made by the main process (the workers, and the servers and clusters the tests start,
# inherit it as TMPDIR) and removed when the main process exits: a worker stopped before
# its fixtures were torn down (xdist gives up on one after 30 s; a Ray test's server and
# cluster can take longer to stop when a time limit stops the run) leaves nothing behind
# it: short_private_dir's directories stay under /tmp (socket paths) but are listed there.
# pytest's own tmp_path directories stay where pytest keeps them, the last few runs'.
# A run whose main process was killed outright (SIGKILL: no atexit) leaves its directory:
# the next run removes it (its owner's pid is gone). The main process removes its own at
# pytest_unconfigure, after its workers ended, and again at exit (what came after).
_RUN_ROOT: str | None = None
if "OMNI_TEST_RUN_ROOT" not in os.environ:  # the main process; a nested pytest run reuses it
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    _PARENT = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    remove_stale_run_roots(_PARENT)
    # multiprocessing's own directory (pymp-*) of this process is made now, outside the
    # run's: made under it later, it would be gone by the time multiprocessing's exit
    # handler removes it (after pytest_unconfigure), which then printed a traceback.
    multiprocessing.util.get_temp_dir()
    # Inductor keeps what it compiled under the temporary directory, across runs: with
    # TMPDIR moved below, every run (and a user's later run) would compile from nothing,
    # the C++ compiler probing each vector ISA first (~7 s) and every kernel again. The
    # suite, and what it starts, keep torch's own default place, as a user's runs do;
    # what is cached is keyed by the graph and the settings, so no result depends on it
    # (bench_compile_start measures a cold start with a directory of its own).
    os.environ.setdefault(
        "TORCHINDUCTOR_CACHE_DIR",
        os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"),
    )
    _RUN_ROOT = tempfile.mkdtemp(prefix="omni-run-", dir=_PARENT)
    Path(_RUN_ROOT, RUN_OWNER).write_text(str(os.getpid()))
    os.environ["OMNI_TEST_RUN_ROOT"] = os.environ["TMPDIR"] = _RUN_ROOT
    tempfile.tempdir = None  # read TMPDIR again
    # with the short directories under /tmp (socket paths) that the tests listed there
    atexit.register(remove_listed_dirs, _RUN_ROOT)

# The fixtures plugin authors load too (plugins, short_tmp), for every suite here.
pytest_plugins = ["omni_core.testing"]

# Every runtime keeps its process logs under $XDG_STATE_HOME/omni/logs (runtime.log_dir's
# default): the suite's go to a directory of its own (inherited by the servers it
# starts), never to the user's, and are removed at exit.
_STATE = tempfile.mkdtemp(prefix="omni-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE
atexit.register(shutil.rmtree, _STATE, ignore_errors=True)

# factory.dtype = auto follows the CPU's flags (bf16 where AMX / AVX512-BF16 computes it
# fast): the suite, and the servers it starts, see a CPU without them, so auto is float32
# on every machine; tests of the bf16 decision inject flags (omni_core.engine.precision).
os.environ.setdefault("OMNI_CPU_FLAGS", "")
# The CPU kernel routes are measured per machine and cached in the user's cache directory
# (omni_core.engine.cpu_kernel_choice): the suite takes the shipped routes, so that no
# number it checks depends on the machine and nothing is written to the user's cache.
os.environ.setdefault("OMNI_CPU_KERNELS", "default")


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        from xdist.workermanage import NodeManager

        # How long a stopped run waits for its workers to tear their fixtures down before
        # it kills them (xdist's 10 s is less than a Ray test's server and cluster take;
        # the worker's own execnet gives up after 15 s).
        NodeManager.EXIT_TIMEOUT = max(getattr(NodeManager, "EXIT_TIMEOUT", 0), 30)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # The main process, its workers ended: its run's directory goes now, not only at exit,
    # where another library's exit handler that ends the process first would skip it.
    if _RUN_ROOT is not None and not hasattr(config, "workerinput"):
        remove_listed_dirs(_RUN_ROOT)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow")


# The modules that take longest here (tens of seconds to two minutes each: the benchmarks'
# smoke groups, servers started and stopped, inductor builds), longest first. ``make
# test`` hands them out first (xdist's --no-loadscope-reorder, Makefile), so that a run
# does not end on one worker finishing a long module while the other waits, as it did
# when xdist ordered modules by their number of tests. Only the order changes: a module
# missing here runs after these, in collection order.
LONGEST_FIRST = (
    "tests/benchmarks/test_smoke_light.py",
    "tests/benchmarks/test_smoke_start.py",
    "tests/benchmarks/test_smoke_gpu_check.py",
    "tests/serve/test_cli_serve.py",
    "tests/benchmarks/test_smoke_served.py",
    "tests/benchmarks/test_smoke_processes.py",
    "tests/engine/test_compiled.py",
    "tests/runtime/test_start_method.py",
    "tests/serve/test_disconnects.py",
    "tests/serve/test_playground_browser.py",
    "plugins/qwen3_omni/tests/test_realtime.py",
    "tests/serve/test_ray_launcher.py",
    "tests/runtime/test_transports.py",
    "tests/runtime/test_runtime.py",
    "tests/config/test_early_refusals.py",
    "plugins/qwen3_asr/tests/test_serve.py",
    "tests/serve/test_qwen3_tts_e2e.py",
    "tests/test_walkthrough.py",
    "plugins/qwen3_omni/tests/test_expert_stack.py",
    "tests/serve/test_ws_speech.py",
    "tests/test_sigterm.py",
    "tests/serve/test_voices_safety.py",
    "tests/serve/test_hostile_clients.py",
    "plugins/qwen3_tts/tests/test_stages.py",
    "tests/runtime/test_weight_share.py",
    "plugins/qwen3_omni/tests/test_serve.py",
    "plugins/moss_tts/tests/test_serve.py",
)


_RANKS = {module: rank for rank, module in enumerate(LONGEST_FIRST)}


def _schedule_rank(item: pytest.Item) -> int:
    module = item.nodeid.split("::", 1)[0]
    return _RANKS.get(module, len(_RANKS))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_schedule_rank)  # stable: each module keeps its own order
    skip_cuda_unless_available([item for item in items if "cuda" in item.keywords])
    if config.getoption("--slow") or os.environ.get("OMNI_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --slow or OMNI_SLOW_TESTS=1 (make test-all)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def skip_cuda_unless_available(items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` need a CUDA device (``benchmarks/gpu_check.py`` runs them).

    torch is imported only when such a test was collected: most runs never pay for it.
    """
    if not items:
        return
    try:
        import torch

        available = torch.cuda.is_available()
    except ImportError:
        available = False
    if not available:
        skip = pytest.mark.skip(reason="cuda: no CUDA device here (make gpu-check runs these)")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _sigterm_still_unwinds() -> Iterator[None]:
    """A test that leaves SIGTERM's handler replaced (``ray.init`` does) would make a stopped
    run end that worker on the spot, its fixtures' servers and directories left behind."""
    yield
    handler = signal.getsignal(signal.SIGTERM)
    if handler is not _SIGTERM_HANDLER:
        signal.signal(signal.SIGTERM, _SIGTERM_HANDLER)
        pytest.fail(
            f"SIGTERM's handler was left replaced by {handler!r}: put it back "
            "(omni_core.sigterm.signal_handlers_kept)",
            pytrace=False,
        )
