"""The seed's worked example, and the precedence rules around it."""

from __future__ import annotations

import pytest

from omni_core.config.render import diff_lines, explain
from omni_core.errors import ConfigError

from .conftest import SEED

ENGINE_FRACTION = ("stages", "tts_engine", "engine", "mem_fraction_static")


def test_diff_shows_exactly_the_two_changes(deploy, resolve):
    res = resolve(
        deploy(SEED), "--vocoder.factory.max_batch_size", "32", "--mem-fraction-static", "0.7"
    )
    assert diff_lines(res) == [
        "stages.tts_engine.engine.mem_fraction_static: None -> 0.7",
        "stages.vocoder.factory.max_batch_size: None -> 32",
    ]
    assert res.config.stage("vocoder").factory.max_batch_size == 32
    assert res.config.stage("tts_engine").engine.mem_fraction_static == 0.7


def test_explain_shows_default_superseded_file_line_and_winning_flag(deploy, resolve):
    path = deploy(SEED)
    res = resolve(path, "--vocoder.factory.max_batch_size", "32", "--mem-fraction-static", "0.7")
    text = explain(res.record(ENGINE_FRACTION))
    lines = text.splitlines()
    assert lines[0] == "stages.tts_engine.engine.mem_fraction_static = 0.7"
    assert lines[1].split() == ["None", "<-", "model", "default"]
    assert lines[2].split() == ["0.6", "<-", f"{path}:5", "[superseded]"]
    assert lines[3].split() == ["0.7", "<-", "--mem-fraction-static", "[winner]"]


def test_cli_matches_the_seed(deploy, cli):
    path = deploy(SEED)
    code, out, _ = cli(
        "config",
        "resolve",
        path,
        "--vocoder.factory.max_batch_size",
        "32",
        "--mem-fraction-static",
        "0.7",
        "--show",
        "diff",
    )
    assert code == 0
    assert out.splitlines() == [
        "stages.tts_engine.engine.mem_fraction_static: None -> 0.7",
        "stages.vocoder.factory.max_batch_size: None -> 32",
    ]
    code, out, _ = cli(
        "config",
        "explain",
        path,
        "tts_engine.engine.mem_fraction_static",
        "--mem-fraction-static",
        "0.7",
    )
    assert code == 0
    assert f"0.6   <- {path}:5  [superseded]" in out
    assert "0.7   <- --mem-fraction-static  [winner]" in out


@pytest.mark.parametrize("order", ["explicit-first", "broadcast-first"])
def test_explicit_path_beats_broadcast_whatever_the_order(deploy, resolve, order):
    broadcast = ["--mem-fraction-static", "0.5"]
    explicit = ["--tts_engine.engine.mem_fraction_static", "0.9"]
    flags = explicit + broadcast if order == "explicit-first" else broadcast + explicit
    res = resolve(deploy(SEED), *flags)
    assert res.config.stage("tts_engine").engine.mem_fraction_static == 0.9
    record = res.record(ENGINE_FRACTION)
    assert [str(w.origin) for w in record.writes][-1] == "--tts_engine.engine.mem_fraction_static"


def test_command_line_beats_file_and_file_beats_default(deploy, resolve):
    res = resolve(deploy(SEED))
    assert res.config.stage("vocoder").factory.max_batch_size == 16
    res = resolve(deploy(SEED), "--vocoder.factory.max_batch_size=32")
    assert res.config.stage("vocoder").factory.max_batch_size == 32


def test_same_path_twice_at_same_precedence_is_refused_naming_both(deploy, resolve):
    with pytest.raises(ConfigError) as info:
        resolve(
            deploy(SEED),
            "--vocoder.factory.max_batch_size",
            "8",
            "--vocoder.factory.max_batch_size=9",
        )
    message = str(info.value)
    assert "stages.vocoder.factory.max_batch_size" in message
    assert "8 by --vocoder.factory.max_batch_size" in message
    assert "9 by --vocoder.factory.max_batch_size" in message


def test_same_value_twice_is_fine(deploy, resolve):
    res = resolve(deploy(SEED), "--mps", "on", "--mps=on")
    assert res.config.mps == "on"


def test_misspelt_stage_names_the_real_stages_and_suggests(deploy, resolve):
    with pytest.raises(ConfigError) as info:
        resolve(deploy(SEED), "--vocodr.factory.dtype", "float16")
    message = str(info.value)
    assert "--vocodr.factory.dtype" in message
    assert "preprocessing, tts_engine, vocoder" in message
    assert "did you mean: vocoder" in message
