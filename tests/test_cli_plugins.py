"""``omni plugins list``: table, ``--json``, ``--all`` and OMNI_PLUGINS, in-process and for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from omni_core.cli import app
from omni_core.plugins import OmniPlugins, get_plugins, reset_plugins

sys.path.insert(0, str(Path(__file__).parent))
from installed_plugins import INSTALLED, shipped_only

BUILTINS = {
    "omni_core.builtins.factory",
    "omni_core.builtins.placement",
    "omni_core.builtins.transports",
    "omni_core.builtins.launchers",
}


def invoke(*args: str, omni_plugins: str | None = None) -> Any:
    """Run the command in-process against a freshly loaded plugin manager."""
    reset_plugins()  # the CLI caches the manager; OMNI_PLUGINS is read when it loads
    env = {"OMNI_PLUGINS": omni_plugins}  # None unsets it for the call
    result = CliRunner().invoke(app, ["plugins", "list", *args], env=env)
    assert result.exit_code == 0, result.output
    return result


def pipelines_by_plugin(payload: dict[str, Any]) -> dict[str, list[str]]:
    return {row["name"]: row["pipelines"] for row in payload["plugins"]}


def table_column(output: str, column: str) -> dict[str, list[str]]:
    """One column of the boxed table, by plugin: the lines of each plugin's cell.

    Reading cells (not searching the whole output) matters: pipeline names are
    substrings of plugin names, so a search passes with an empty column.
    """
    lines = [line for line in output.splitlines() if line.startswith("│")]
    header, body = lines[0], lines[1:]
    index = [cell.strip() for cell in header.strip("│").split("│")].index(column)
    cells: dict[str, list[str]] = {}
    plugin = ""
    for line in body:
        row = [cell.strip() for cell in line.strip("│").split("│")]
        plugin = row[0] or plugin
        cells.setdefault(plugin, [])
        if row[index]:
            cells[plugin].append(row[index])
    return cells


@pytest.mark.usefixtures("plugins")
def test_the_table_lists_every_installed_plugin_and_its_pipelines() -> None:
    output = invoke().output
    assert shipped_only(table_column(output, "pipelines")) == INSTALLED
    # The table shows what --json reports.
    assert table_column(output, "pipelines") == pipelines_by_plugin(
        json.loads(invoke("--json").output)
    )
    assert "register_pipelines" in output
    for name in BUILTINS:
        assert name not in output


@pytest.mark.usefixtures("plugins")
def test_json_lists_every_installed_plugin_and_its_pipelines() -> None:
    payload = json.loads(invoke("--json").output)
    assert shipped_only(pipelines_by_plugin(payload)) == INSTALLED
    assert payload["unknown_requested"] == []
    row = payload["plugins"][0]
    assert set(row) == {
        "name",
        "version",
        "builtin",
        "hooks",
        "pipelines",
        "placement_policies",
        "transports",
        "launchers",
        "error",
    }


@pytest.mark.usefixtures("plugins")
def test_builtins_appear_only_with_all() -> None:
    payload = json.loads(invoke("--json", "--all").output)
    builtin = {row["name"] for row in payload["plugins"] if row["builtin"]}
    assert builtin >= BUILTINS
    assert pipelines_by_plugin(payload).items() >= INSTALLED.items()
    table = invoke("--all").output
    assert table_column(table, "pipelines") == pipelines_by_plugin(payload)
    assert table_column(table, "transports")["omni_core.builtins.transports"] == [
        "inproc",
        "shm",
        "socket",
        "tcp",
    ]
    assert table_column(table, "launchers")["omni_core.builtins.launchers"] == ["local", "ray"]
    for name in BUILTINS:
        assert name in table


@pytest.mark.usefixtures("plugins")
@pytest.mark.parametrize(
    ("value", "expected"),
    [("omni-qwen3-tts", ["omni-qwen3-tts"]), ("qwen3_omni", ["omni-qwen3-omni"]), ("", [])],
)
def test_omni_plugins_restricts_the_listing(value: str, expected: list[str]) -> None:
    payload = json.loads(invoke("--json", omni_plugins=value).output)
    assert [row["name"] for row in payload["plugins"]] == expected


@pytest.mark.usefixtures("plugins")
def test_an_empty_listing_says_how_to_get_plugins() -> None:
    assert "no plugins installed" in invoke(omni_plugins="").output


@pytest.mark.usefixtures("plugins")
def test_an_unknown_requested_plugin_is_a_warning() -> None:
    result = invoke(omni_plugins="omni-qwen3-tts,omni-nope")
    assert "omni-qwen3-tts" in result.output
    assert "OMNI_PLUGINS names plugins that are not installed: omni-nope" in result.output
    payload = json.loads(invoke("--json", omni_plugins="omni-nope").output)
    assert payload == {"plugins": [], "unknown_requested": ["omni-nope"]}


def test_a_broken_plugin_is_shown_with_its_error(plugins: OmniPlugins) -> None:
    plugins.register_broken("omni-fake-model", ImportError("No module named 'fake_model'"))
    assert get_plugins(lambda: plugins) is plugins  # the CLI will use this manager
    result = CliRunner().invoke(app, ["plugins", "list", "--json"])
    rows = {row["name"]: row for row in json.loads(result.output)["plugins"]}
    assert rows["omni-fake-model"]["error"] == "ImportError: No module named 'fake_model'"
    assert rows["omni-qwen3-tts"]["pipelines"] == ["qwen3-tts"]


# -- through a real process ------------------------------------------------------


def run_omni(
    argv: list[str], omni_plugins: str | None, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OMNI_PLUGINS"}
    if omni_plugins is not None:
        env["OMNI_PLUGINS"] = omni_plugins
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def console_script() -> list[str]:
    """The installed ``omni`` next to this interpreter, else ``python -m omni_core``."""
    script = Path(sys.executable).with_name("omni")
    return [str(script)] if script.exists() else [sys.executable, "-m", "omni_core"]


@pytest.mark.parametrize(
    ("command", "value", "expected"),
    [
        (console_script(), None, INSTALLED),
        ([sys.executable, "-m", "omni_core"], "omni-qwen3-tts", {"omni-qwen3-tts": ["qwen3-tts"]}),
        (console_script(), "", {}),
    ],
    ids=["all", "only-qwen3-tts", "none"],
)
def test_the_installed_command_lists_plugins(
    command: list[str], value: str | None, expected: dict[str, list[str]]
) -> None:
    done = run_omni([*command, "plugins", "list", "--json"], value)
    assert done.returncode == 0, done.stderr
    assert shipped_only(pipelines_by_plugin(json.loads(done.stdout))) == expected


def test_the_installed_command_prints_a_table() -> None:
    done = run_omni([*console_script(), "plugins", "list"], None)
    assert done.returncode == 0, done.stderr
    assert shipped_only(table_column(done.stdout, "pipelines")) == INSTALLED
    assert "Traceback" not in done.stderr


def test_the_installed_command_shows_a_misspelt_hook_as_that_plugins_error(tmp_path: Path) -> None:
    info = tmp_path / "omni_typo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: omni-typo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[omni]\ntypo = omni_typo_cli_plugin\n")
    (tmp_path / "omni_typo_cli_plugin.py").write_text(
        "from omni_core import hookimpl\n\n\n@hookimpl\ndef omni_register_pipeline():\n"
        "    return []\n"
    )
    done = run_omni([*console_script(), "plugins", "list", "--json"], None, tmp_path)
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["plugins"]}
    assert rows["omni-typo"]["error"] == (
        "omni_register_pipeline is not an omni hook; did you mean omni_register_pipelines?"
    )
    assert rows["omni-typo"]["hooks"] == []
    assert {name: rows[name]["pipelines"] for name in INSTALLED} == INSTALLED
    table = run_omni([*console_script(), "plugins", "list"], None, tmp_path)
    assert "omni_register_pipeline is not an omni hook" in table.stdout
    assert "Traceback" not in table.stderr
