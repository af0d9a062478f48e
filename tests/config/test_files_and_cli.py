"""Deploy files, the shipped examples, round trips, and the CLI's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_core.config.toml_lines import key_lines
from omni_core.errors import ConfigError

from .conftest import EXAMPLES, SEED

PIPELINES = ["qwen3-tts", "moss-tts", "qwen3-omni", "qwen3-omni-colocated", "qwen3-omni-text"]


def test_every_pipeline_has_an_example():
    shipped = {
        line.split('"')[1]
        for example in EXAMPLES
        for line in example.read_text().splitlines()
        if line.startswith("pipeline")
    }
    assert set(PIPELINES) <= shipped


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_resolve_and_round_trip(example, cli, tmp_path):
    code, first, err = cli("config", "resolve", str(example))
    assert code == 0, err
    again = tmp_path / "again.toml"
    again.write_text(first)
    code, second, err = cli("config", "resolve", str(again))
    assert code == 0, err
    assert _body(first) == _body(second)
    code, as_json, _ = cli("config", "resolve", str(example), "--format", "json")
    _code2, again_json, _ = cli("config", "resolve", str(again), "--format", "json")
    assert json.loads(as_json) == json.loads(again_json)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_defaults_round_trip_for_every_pipeline(pipeline, cli, tmp_path):
    code, first, err = cli("config", "resolve", "--pipeline", pipeline)
    assert code == 0, err
    again = tmp_path / "again.toml"
    again.write_text(first)
    code, second, _ = cli("config", "resolve", str(again))
    assert _body(first) == _body(second)
    code, diff, _ = cli("config", "resolve", str(again), "--show", "diff")
    # Writing every default explicitly changes nothing.
    assert diff.strip() == "no changes: every value is the model default"


def test_round_trip_keeps_a_null_that_overrides_a_default(cli, tmp_path):
    _, first, _ = cli(
        "config", "resolve", "--pipeline", "qwen3-omni", "--code2wav.gpu_memory_fraction", "none"
    )
    assert 'gpu_memory_fraction = "none"' in first
    again = tmp_path / "again.toml"
    again.write_text(first)
    _code, diff, _ = cli("config", "resolve", str(again), "--show", "diff")
    assert "stages.code2wav.gpu_memory_fraction: 0.02 -> None" in diff


def _body(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_pipeline_is_required_unless_given_by_flag(deploy, resolve, cli):
    path = deploy("[stages.vocoder.factory]\nmax_batch_size = 4\n")
    with pytest.raises(ConfigError, match="does not say which pipeline"):
        resolve(path)
    assert resolve(path, pipeline="qwen3-tts").config.stage("vocoder").factory.max_batch_size == 4
    code, _, err = cli("config", "resolve")
    assert code == 2 and "give a deploy file or --pipeline" in err


def test_unknown_pipeline_suggests_and_names_its_origin(deploy, resolve):
    path = deploy('pipeline = "qwen3-tt"\n')
    with pytest.raises(ConfigError) as info:
        resolve(path)
    assert f"{path}:1" in str(info.value) and "did you mean: qwen3-tts" in str(info.value)


def test_pipeline_alias_resolves(deploy, resolve):
    res = resolve(deploy('pipeline = "Qwen3TTSForConditionalGeneration"\n'))
    assert res.pipeline_cls.pipeline_name == "qwen3-tts"


def test_toml_syntax_error_gives_file_line_col(deploy, cli):
    path = deploy('pipeline = "qwen3-tts"\n[stages.vocoder]\ngpu = = 1\n')
    code, _out, err = cli("config", "resolve", path)
    assert code == 2
    assert f"{path}:3:" in err and "invalid TOML" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("value", "line", "what"),
    [
        ("a = " + "[" * 2000 + "]" * 2000, 2, "arrays and inline tables nest more than 64"),
        ("x = " + "{a=" * 2000 + "1" + "}" * 2000, 2, "arrays and inline tables nest more than 64"),
        ("[stages.vocoder.factory]\n" + ".".join(["k"] * 100) + " = 1", 3, "keys and tables nest"),
        ('s = """\n' + "[" * 2000 + '\n"""\n# ' + "{" * 2000, None, None),  # text, not nesting
    ],
)
def test_deeply_nested_files_are_a_config_error_not_a_crash(deploy, cli, value, line, what):
    path = deploy('pipeline = "qwen3-tts"\n' + value + "\n")
    code, _out, err = cli("plan", path, "--no-detect")
    if what is None:  # brackets inside strings and comments do not count
        assert "nest more than" not in err
        return
    assert code == 2, err
    assert f"{path}:{line}: {what}" in err
    assert "Traceback" not in err and "RecursionError" not in err


def test_a_deeply_nested_flag_value_is_text_not_a_crash(deploy, resolve):
    deep = "[" * 3000 + "]" * 3000
    with pytest.raises(ConfigError, match=r"server\.header_timeout: expected a number"):
        resolve(None, "--server.header_timeout", deep, pipeline="qwen3-tts")


def test_missing_file_is_a_clear_error(cli, tmp_path):
    code, _, err = cli("config", "resolve", str(tmp_path / "nope.toml"))
    assert code == 2 and "does not exist" in err


def test_explain_accepts_both_spellings_and_shows_untouched_defaults(deploy, cli):
    path = deploy(SEED)
    code, out, _ = cli("config", "explain", path, "stages.vocoder.factory.max_batch_size")
    assert code == 0 and "16" in out
    code, out, _ = cli("config", "explain", path, "vocoder.factory.chunk_frames")
    assert out.splitlines()[0] == "stages.vocoder.factory.chunk_frames = 4"
    assert "model default (nothing overrides it)" in out
    code, out, _ = cli("config", "explain", "--pipeline", "qwen3-tts", "mps")
    assert code == 0 and out.startswith('mps = "off"')
    code, _, err = cli("config", "explain", path, "vocoder.nope")
    assert code == 2 and "has no field 'nope'" in err


def test_provenance_lists_every_touched_path(deploy, cli):
    code, out, _ = cli("config", "resolve", deploy(SEED), "--mps", "auto", "--show", "provenance")
    assert code == 0
    heads = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert heads == [
        'model_path = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"',
        "stages.tts_engine.engine.mem_fraction_static = 0.6",
        "stages.vocoder.factory.max_batch_size = 16",
        'mps = "auto"',
    ]


def test_diff_when_nothing_changed(cli):
    _code, out, _ = cli("config", "resolve", "--pipeline", "qwen3-tts", "--show", "diff")
    assert out.strip() == "no changes: every value is the model default"


@pytest.mark.parametrize(
    "args",
    [
        ["config", "resolve", "SEED", "--vocodr.factory.dtype", "float16"],
        ["config", "resolve", "SEED", "--vocoder.factory.max_batch_size"],
        ["config", "resolve", "SEED", "stray"],
        ["config", "resolve", "SEED", "--show", "everything"],
        ["config", "explain", "SEED"],
    ],
)
def test_errors_exit_2_without_traceback_in_a_subprocess(args, deploy):
    path = deploy(SEED)
    argv = [path if a == "SEED" else a for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "omni_core", *argv], capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip()


def test_resolving_imports_no_torch(deploy, shipped_plugins_env):
    path = deploy(SEED)
    code = (
        "import sys\nfrom omni_core.cli import main\n"
        f"main(['config', 'resolve', {path!r}, '--show', 'provenance'])\n"
        f"main(['config', 'explain', {path!r}, 'tts_engine.engine.mem_fraction_static'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'numpy' not in sys.modules, 'numpy was imported'\n"
    )
    # the shipped plugins only: a developer's own plugin may import numpy (or torch) at will
    env = shipped_plugins_env
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr


def test_key_lines_handle_inline_tables_arrays_and_strings():
    text = (
        'a = """multi\n[not.a.table]\n"""\n'  # 1-3
        "[t]\n"  # 4
        "x = [\n  1,\n  2,\n]\n"  # 5-8
        "y = { z = 1 }\n"  # 9
        '"q.k" = 2\n'  # 10
        "[[shared]]\n"  # 11
        "v = 1\n"  # 12
        "[[shared]]\n"  # 13
    )
    lines = key_lines(text)
    assert lines[("a",)] == 1
    assert ("not", "a", "table") not in lines
    assert lines[("t", "x")] == 5
    assert lines[("t", "y")] == 9
    assert lines[("t", "q.k")] == 10
    assert lines[("shared", "0")] == 11 and lines[("shared", "0", "v")] == 12
    assert lines[("shared", "1")] == 13


def test_readme_plan_example_exists():
    assert (Path(__file__).resolve().parents[2] / "examples" / "qwen3_tts.toml").exists()
