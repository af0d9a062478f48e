"""The command line's manners: --version, -h, did-you-mean for flags, a pointer to the demo."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_version_names_the_core_and_every_installed_plugin(cli, plugins):
    code, out, err = cli("--version")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("omni-core ")
    listed = {row["name"] for row in plugins.listing()}
    assert {line.split()[0] for line in lines[1:]} == listed


@pytest.mark.parametrize("args", [("-h",), ("plan", "-h"), ("serve", "-h"), ("config", "-h")])
def test_dash_h_is_help_everywhere(cli, args):
    code, out, err = cli(*args)
    assert code == 0, err
    assert out.startswith("Usage: omni")


@pytest.mark.parametrize(
    ("command", "typo", "meant"),
    [("serve", "--prot", "--port"), ("plan", "--jsn", "--json"), ("serve", "--hots", "--host")],
)
def test_a_misspelt_option_gets_did_you_mean_and_exit_2(cli, command, typo, meant):
    code, _out, err = cli(command, str(EXAMPLES / "qwen3_tts_demo.toml"), typo, "x")
    assert code == 2
    assert f"no such option: {typo}" in err and f"did you mean {meant}?" in err


def test_settings_flags_are_not_mistaken_for_misspelt_options(cli):
    code, _out, err = cli(
        "plan", str(EXAMPLES / "qwen3_tts_demo.toml"), "--mps", "off", "--gpus", "1", "--json"
    )
    assert code == 0, err


@pytest.mark.parametrize("command", ["serve", "plan", "run"])
def test_no_deploy_file_points_at_the_built_in_demo(cli, command):
    code, _out, err = cli(command)
    assert code == 2
    assert f"omni {command} examples/qwen3_tts_demo.toml" in err
    assert (EXAMPLES / "qwen3_tts_demo.toml").is_file()


def test_diff_against_the_file_lists_only_what_the_flags_changed(cli):
    deploy = str(EXAMPLES / "qwen3_tts.toml")  # sets mem_fraction_static 0.6
    flags = ("--mem-fraction-static", "0.7", "--show", "diff")
    code, out, _ = cli("config", "resolve", deploy, *flags)
    assert code == 0
    assert "stages.tts_engine.engine.mem_fraction_static: None -> 0.7" in out
    assert "stages.vocoder.factory.max_batch_size: None -> 16" in out
    code, out, _ = cli("config", "resolve", deploy, *flags, "--against", "file")
    assert code == 0
    assert out.strip() == "stages.tts_engine.engine.mem_fraction_static: 0.6 -> 0.7"
