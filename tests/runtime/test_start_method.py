"""How stage processes start: forked from a server that loaded torch once, or spawned.

The fork server saves each stage process the interpreter start and the import of
torch; these tests check what it must keep of spawn's behaviour (the parent's
environment at the start, no orphans) and the variable that chooses the method.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omni_core.errors import ConfigError
from omni_core.runtime.launchers import fork_env
from omni_core.runtime.launchers.local import START_METHOD_ENV, start_method

sys.path.insert(0, str(Path(__file__).parent))

pytestmark = pytest.mark.anyio

LINUX = sys.platform.startswith("linux")


def _stage_pid(outputs: dict, stage: str) -> int:
    """The pid of ``stage``'s process, from the trail the last stage (``b``) returns."""
    return {e.split(":")[0]: int(e.split(":")[1]) for e in outputs["b"]["trail"]}[stage]


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(not LINUX, reason="reads /proc")
async def test_stage_processes_fork_from_a_server_that_loaded_torch(deployment, monkeypatch):
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    async with deployment("t-two-process") as runtime:
        outputs = await runtime.run({})
        stages = {_stage_pid(outputs, "a"), _stage_pid(outputs, "b")}
        servers = {_parent_of(pid) for pid in stages}
        assert len(servers) == 1 and os.getpid() not in servers
        server = servers.pop()
        assert _parent_of(server) == os.getpid()
        cmdline = Path(f"/proc/{server}/cmdline").read_bytes().decode()
        assert "multiprocessing.forkserver" in cmdline
        assert "libtorch" in Path(f"/proc/{server}/maps").read_text()


@pytest.mark.skipif(not LINUX, reason="reads /proc")
async def test_spawn_when_the_variable_says_so(deployment, monkeypatch):
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    async with deployment("t-two-process") as runtime:
        outputs = await runtime.run({})
        assert _parent_of(_stage_pid(outputs, "b")) == os.getpid()


async def test_a_forked_stage_sees_the_environment_of_its_start_not_the_servers(
    deployment, monkeypatch
):
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    names = {"names": ["OMNI_TEST_USER"]}
    async with deployment("t-env") as runtime:  # the fork server runs from here on
        before = await runtime.run(names)
    monkeypatch.setenv("OMNI_TEST_USER", "set after the server started")
    async with deployment("t-env") as runtime:
        after = await runtime.run(names)
    assert before["env"] == {"OMNI_TEST_USER": "stage"}  # the stage's default
    assert after["env"] == {"OMNI_TEST_USER": "set after the server started"}


def test_the_default_is_the_fork_server_where_the_platform_has_one(monkeypatch):
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    import multiprocessing

    has_server = "forkserver" in multiprocessing.get_all_start_methods()
    assert start_method() == ("forkserver" if has_server else "spawn")
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    assert start_method() == "spawn"


def test_an_unknown_method_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(START_METHOD_ENV, "fork")
    with pytest.raises(ConfigError) as refused:
        start_method()
    assert "OMNI_START_METHOD='fork'" in str(refused.value)
    assert "forkserver, spawn" in refused.value.hint


PROBE = """
import os, sys, types, anyio
from omni_core.runtime.launchers.local import LocalSession

anyio.run(LocalSession(types.SimpleNamespace(nodes=None, processes=[])).open)
servers = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode()
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and "multiprocessing.forkserver" in cmdline:
            servers.append("libtorch" in open(f"/proc/{entry}/maps").read())
print(servers)
"""


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_opening_a_session_leaves_the_fork_server_ready_with_torch_imported(monkeypatch):
    """So that starting the first stage process, which happens on the event loop's
    thread, does not hold the loop while the server imports torch."""
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    ran = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == "[True]"


SERVER_PARENT = """
import sys
from omni_core.runtime.launchers.local import warm_fork_server

warm_fork_server()
print("ready", flush=True)
sys.stdin.read()  # until the test kills it, or closes stdin for a normal exit
"""


def _serve_then_end(tmp: Path, kill: bool) -> list[str]:
    """Start a fork server from a parent whose temporary directory is ``tmp``, end the
    parent (SIGKILL or a normal exit), and list what ``tmp`` holds once the server is gone."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop(START_METHOD_ENV, None)
    parent = subprocess.Popen(
        [sys.executable, "-c", SERVER_PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert parent.stdout is not None and parent.stdin is not None
        assert parent.stdout.readline() == b"ready\n"
        held = [p.name for p in tmp.iterdir()]
        assert len(held) == 1 and held[0].startswith("pymp-")  # the server's socket is there
        if kill:
            parent.kill()
        else:
            parent.stdin.close()
        parent.wait(30)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 15
    while any(tmp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p.name for p in tmp.iterdir()]


@pytest.mark.skipif(not LINUX, reason="the fork server is POSIX-only")
@pytest.mark.parametrize("kill", [True, False], ids=["sigkill", "normal-exit"])
def test_the_fork_servers_socket_directory_goes_with_its_parent(short_tmp, kill):
    """A SIGKILLed omni serve cannot remove the fork server's /tmp/pymp-* directory;
    the server, which outlives it by a moment, does (a normal exit removes it itself)."""
    tmp = short_tmp / "t"
    tmp.mkdir(mode=0o700)
    assert _serve_then_end(tmp, kill) == []


@pytest.mark.skipif(not LINUX, reason="reads /proc")
async def test_a_process_wanting_openmp_settings_the_server_did_not_read_is_spawned(
    deployment, monkeypatch
):
    """OpenMP read its variables when the fork server loaded torch; a process that
    wants others must start as a fresh interpreter, which reads its own."""
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    fork_env.fork_can_serve({})  # the server runs, started from this environment
    assert "OMP_WAIT_POLICY" not in (fork_env.server_settings() or {})
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    async with deployment("t-two-process") as runtime:
        outputs = await runtime.run({})
        assert _parent_of(_stage_pid(outputs, "b")) == os.getpid()  # spawned, not forked


def test_the_settings_a_process_wants_and_those_all_share():
    planned = {"GOMP_SPINCOUNT": "1000", "OMP_NUM_THREADS": "2", "PATH": "/bin"}
    # OMP_NUM_THREADS is applied through torch at run time; the user's value wins
    assert fork_env.wanted_settings(planned, {"GOMP_SPINCOUNT": "5"}) == {"GOMP_SPINCOUNT": "5"}
    assert fork_env.wanted_settings(planned, {}) == {"GOMP_SPINCOUNT": "1000"}
    common = fork_env.common_settings(
        [{"GOMP_SPINCOUNT": "1000", "KMP_A": "1"}, {"GOMP_SPINCOUNT": "1000", "KMP_A": "2"}]
    )
    assert common == {"GOMP_SPINCOUNT": "1000"}
    assert fork_env.common_settings([]) == {}


CUDA_PROBE = """
import importlib, torch, torch.cuda
touched = []
def spy(owner, name):
    original = getattr(owner, name, None)
    if original is None:  # a CPU build has no CUDA bindings
        return
    def call(*args, **kwargs):
        touched.append(name)
        return original(*args, **kwargs)
    setattr(owner, name, call)
for name in ("is_available", "device_count", "init", "current_device", "set_device",
             "get_device_properties", "mem_get_info", "synchronize"):
    spy(torch.cuda, name)
spy(torch._C, "_cuda_getDeviceCount")
from omni_core.runtime.launchers.local import PRELOAD
for module in PRELOAD:
    importlib.import_module(module)
print(sorted(set(touched)))
"""


def test_what_the_fork_server_preloads_never_asks_cuda_anything():
    """A process that initialised CUDA cannot give it to a forked child ("Cannot
    re-initialize CUDA in forked subprocess"), and every stage process forks from the
    server: the modules it imports must not query CUDA at import time. The CPU build
    here cannot fail that way, so the calls are watched."""
    ran = subprocess.run(
        [sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == "[]"


RESTART_PROBE = """
import os, signal, time
from omni_core.runtime.launchers import fork_env
from omni_core.runtime.launchers.local import start_context
from omni_core.runtime.pids import running

os.environ.pop("OMP_WAIT_POLICY", None)
start_context("forkserver")
asked = {**fork_env.openmp_settings(os.environ), "OMP_WAIT_POLICY": "PASSIVE"}
fork_env.start_server(asked)
first = fork_env.server_pid()
os.kill(first, signal.SIGKILL)
while running(first):  # dead once a zombie: multiprocessing reaps it itself
    time.sleep(0.01)
print(fork_env.fork_can_serve(asked), fork_env.server_pid() != first)
"""


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_fork_server_that_died_comes_back_with_the_settings_asked_for():
    """Its stage processes die with it; those started again should still fork. In a
    process of its own: killing this test worker's server would kill other tests'
    stage processes."""
    ran = subprocess.run(
        [sys.executable, "-c", RESTART_PROBE], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == ["True", "True"]


UNGUARDED = """
import sys
sys.path.insert(0, {here!r})
import anyio
import omni_test_pipelines as tp
from omni_core.harness import plan_on_cpu
from omni_core.plugins import OmniPlugins

plugins = OmniPlugins(env={{}})
plugins.register(tp, tp.HERE)
planned = plan_on_cpu(plugins, {base!r}, pipeline="t-two-process")


async def main():
    async with planned.runtime() as runtime:
        print("ran", await runtime.run({{}}) is not None, flush=True)

{start}
"""


# the guarded script starting cleanly is make test-all's (2.4 s); the benchmarks' smoke
# runs start the runtime from guarded scripts in make test anyway
@pytest.mark.parametrize(
    "guarded",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["top-level", "under-main"],
)
def test_a_script_that_starts_omni_at_its_top_level_is_told_to_guard_it(
    short_tmp, monkeypatch, guarded
):
    """Every stage process runs the parent's main script again (forkserver and spawn), so
    a script that starts omni unguarded fails inside the child, before omni's worker ran
    and opened its log; the parent's error said only "(no log)"."""
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    start = 'if __name__ == "__main__":\n    anyio.run(main)' if guarded else "anyio.run(main)"
    script = short_tmp / "starts_omni.py"
    script.write_text(
        UNGUARDED.format(here=str(Path(__file__).parent), base=str(short_tmp), start=start)
    )
    ran = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    if guarded:
        assert ran.returncode == 0, ran.stderr[-2000:]
        assert ran.stdout.strip() == "ran True"
        return
    assert ran.returncode == 1
    last = ran.stderr.strip().splitlines()
    assert "while starting" in ran.stderr and "(no log)" in ran.stderr
    assert any('put that code under `if __name__ == "__main__":`' in line for line in last[-3:])
