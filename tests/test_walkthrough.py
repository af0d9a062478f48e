"""The CONTRIBUTING.md walk-through plugin (examples/plugin), exercised end to end.

Registered in-process (as a test would, without installing it); the spawned
children load it by module name. Every piece the walk-through writes is used:
the pipeline and its factories, the placement policy, the transport, and
``omni run``. The tests pass whether or not ``omni-hello`` is installed
(``pip install -e examples/plugin``); the ``installed`` fixture installs it
for one test (a ``.dist-info`` on ``sys.path`` is all an entry point needs),
so installed-and-registered-in-process is always tested.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import tomli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plugin"
sys.path.insert(0, str(EXAMPLE))

import omni_hello.plugin as hello  # noqa: E402

from omni_core.config import load_deployment  # noqa: E402
from omni_core.plan import plan_deployment  # noqa: E402
from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu  # noqa: E402


def really_installed() -> bool:
    """Is the omni-hello distribution installed in this environment (pip install -e)?"""
    try:
        metadata.distribution("omni-hello")
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture
def hello_plugins(plugins):
    with plugins.registered(hello, "omni_hello.plugin"):
        yield plugins


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """omni-hello installed for this test: its metadata and entry point on ``sys.path``.

    Yields the directory to put on ``PYTHONPATH`` (with ``EXAMPLE``) for a subprocess.
    """
    site = tmp_path / "site"
    info = site / "omni_hello-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: omni-hello\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[omni]\nhello = omni_hello.plugin\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("OMNI_PLUGINS", raising=False)
    yield site


def test_the_distribution_declares_its_entry_point():
    project = tomli.loads((EXAMPLE / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["omni"] == {"hello": "omni_hello.plugin"}


def test_listing_shows_what_the_plugin_registers(hello_plugins):
    (row,) = [r for r in hello_plugins.listing() if "hello" in r["pipelines"]]  # listed once
    assert row["name"] == ("omni-hello" if really_installed() else "omni_hello.plugin")
    assert row["error"] is None
    assert row["pipelines"] == ["hello"]
    assert row["placement_policies"] == ["spread-replicas"]
    assert row["transports"] == ["traced"]
    assert row["hooks"] == [
        "omni_register_pipelines",
        "omni_register_placement_policies",
        "omni_register_transports",
    ]


def _resolve(plugins, *flags):
    return load_deployment(str(EXAMPLE / "hello.toml"), list(flags), plugins=plugins)


def test_the_policy_spreads_replicas_over_the_gpus(hello_plugins):
    plan = plan_deployment(_resolve(hello_plugins).config, plugins=hello_plugins)
    assert plan.policy == "spread-replicas"
    placed = {s.instance: s.gpus for s in plan.stages}
    assert placed == {"greet": (), "shout@r0": (0,), "shout@r1": (1,)}


def test_the_policy_refuses_without_a_gpu_inventory(hello_plugins):
    from omni_core.errors import ConfigError

    with pytest.raises(ConfigError, match="spread-replicas needs to know the GPUs"):
        plan_deployment(
            _resolve(hello_plugins, "--cluster.gpus", "none").config, plugins=hello_plugins
        )


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_requests_run_through_both_replicas_and_the_traced_transport(
    hello_plugins, tmp_path, short_tmp, monkeypatch, anyio_backend
):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("OMNI_HELLO_TRACE", str(trace))
    # The deploy file's own policy (policy=None), planned against the GPUs it declares;
    # the children get the plugin from its entry point or, if not installed, by module name.
    planned = plan_on_cpu(hello_plugins, short_tmp, deploy=EXAMPLE / "hello.toml", policy=None)
    assert planned.plan.policy == "spread-replicas"
    assert planned.plugin_modules == ([] if really_installed() else ["omni_hello.plugin"])
    async with planned.runtime() as runtime:
        results = [(await runtime.run({"name": name}))["shout"] for name in ("ada", "alan")]
    assert [r["text"] for r in results] == ["HELLO, ADA!!", "HELLO, ALAN!!"]
    assert {r["gpu_id"] for r in results} == {0, 1}  # least-loaded binding used both replicas
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    sent = [r for r in records if r["direction"] == "out"]
    assert [(r["kind"], r["source"], r["target"]) for r in sent] == [
        ("deliver", "greet", "shout"),
        ("deliver", "greet", "shout"),
    ]


def test_the_pipeline_declares_what_omni_run_and_serve_need():
    from omni_hello.pipeline import HelloPipeline

    from omni_core.serve.service import Serving

    serving = Serving.of(HelloPipeline)  # what `omni run` and `omni serve` check first
    assert (serving.api, serving.text_stage, serving.audio_stage) == (("chat",), "shout", None)


# -- installed, and registered in-process too ----------------------------------


def test_installed_and_registered_in_process_is_one_plugin(installed):
    from omni_hello.pipeline import HelloPipeline

    from omni_core.errors import PluginError

    plugins = OmniPlugins(env={})
    assert plugins.records["omni-hello"].plugin is hello  # the entry point loaded this module
    assert plugins.register(hello, "omni_hello.plugin") == "omni-hello"
    rows = [r for r in plugins.listing() if "hello" in r["pipelines"]]
    assert [(r["name"], r["version"], r["error"]) for r in rows] == [("omni-hello", "0.1.0", None)]
    assert plugins.in_process_modules() == []  # the children load it from its entry point

    plugins.unregister("omni_hello.plugin")  # the in-process name goes, the installed plugin stays
    assert plugins.pipeline("hello") is HelloPipeline
    with plugins.registered(hello, "omni_hello.plugin") as name:
        assert name == "omni-hello"
    assert plugins.pipeline("hello") is HelloPipeline  # leaving the block kept it too
    plugins.unregister("omni-hello")
    with pytest.raises(PluginError, match="no plugin provides a pipeline called 'hello'"):
        plugins.pipeline("hello")


def test_children_load_a_plugin_both_installed_and_named_in_plugin_modules(installed, short_tmp):
    plugins = OmniPlugins(env={})  # hello from its entry point, here and in each child
    # Each child loads the entry point, then imports the module named here: one plugin.
    planned = plan_on_cpu(
        plugins, short_tmp, pipeline="hello", plugin_modules=["omni_hello.plugin"]
    )
    assert planned.run({"name": "ada"})["shout"]["text"] == "HELLO, ADA!"


# -- omni run ------------------------------------------------------------------

REGISTER_AND_RUN = """
import sys
if __name__ == "__main__":  # as tests/serve/omni_launch.py: the plugin registered in-process
    import omni_hello.plugin as hello
    from omni_core.cli import main
    from omni_core.plugins import get_plugins

    get_plugins().register(hello, "omni_hello.plugin")
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("how", ["registered", "installed", "installed+registered"])
def test_omni_run_answers_a_prompt_with_the_walkthrough_pipeline(
    how: str, request: pytest.FixtureRequest, short_tmp: Path
) -> None:
    path = [str(EXAMPLE)]
    if how.startswith("installed"):
        path.insert(0, str(request.getfixturevalue("installed")))
    env = {k: v for k, v in os.environ.items() if k != "OMNI_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(path)
    command = (
        [sys.executable, "-c", REGISTER_AND_RUN]
        if how.endswith("registered")
        else [sys.executable, "-m", "omni_core"]
    )
    args = ["run", "--pipeline", "hello", "--prompt", "ada", "--endpoints.base_path", short_tmp]
    done = subprocess.run(
        [*command, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "HELLO, ADA!\n"
    assert "Traceback" not in done.stderr
    assert os.listdir(short_tmp) == []  # the runtime directory is gone


# -- CONTRIBUTING.md is the walk-through -----------------------------------------

DOC_FILE = re.compile(r"<!-- file: (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?)```\n", re.S)


def doc_files() -> dict[str, str]:
    """The files CONTRIBUTING.md shows, by path: each block after a ``<!-- file: PATH -->``."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    return {match["path"]: match["body"] for match in DOC_FILE.finditer(text)}


def example_files() -> dict[str, str]:
    """The sources of examples/plugin (no caches, no build or install leftovers)."""
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for path in sorted(EXAMPLE.rglob("*"))
        if path.suffix in {".py", ".toml"}
        and not any(
            part in {"__pycache__", "build"} or part.endswith(".egg-info") for part in path.parts
        )
    }


def test_contributing_shows_every_file_of_the_walkthrough_as_it_is():
    assert doc_files() == example_files()


def test_the_walkthrough_built_from_contributing_passes_its_own_tests(tmp_path: Path):
    project = tmp_path / "omni-hello"
    for name, body in doc_files().items():
        target = project / Path(name).relative_to("examples/plugin")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    env = {k: v for k, v in os.environ.items() if k not in {"OMNI_PLUGINS", "PYTEST_ADDOPTS"}}
    env["PYTHONPATH"] = str(project)  # not examples/plugin: only what the document shows
    where = subprocess.run(
        [sys.executable, "-c", "import omni_hello.plugin as p; print(p.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(project)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
