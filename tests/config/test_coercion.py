"""Values are coerced by the declared type of their field, without loss."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from omni_core.config.coerce import coerce, toml_scalar
from omni_core.errors import ConfigError
from omni_core.schema import validation_message

from .conftest import SEED


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("7", 7),
        ("0.5", 0.5),
        ("bfloat16", "bfloat16"),
        ('"7"', "7"),
        ("[1, 2]", [1, 2]),
    ],
)
def test_free_form_keys_use_toml_scalar_rules(text, expected):
    assert toml_scalar(text) == expected
    assert type(toml_scalar(text)) is type(expected)


def test_free_form_factory_key_from_a_flag(resolve):
    # qwen3-omni's decode stage declares no factory settings: its keys pass through
    res = resolve(
        None,
        "--decode.factory.use_fast_path",
        "true",
        "--decode.factory.warmup",
        "3",
        pipeline="qwen3-omni",
    )
    extra = res.config.stage("decode").factory.model_extra
    assert extra == {"use_fast_path": True, "warmup": 3}


def test_a_key_a_stage_does_not_declare_is_refused_with_a_suggestion(resolve):
    with pytest.raises(ConfigError) as refused:
        resolve(None, "--vocoder.factory.max_batch_sise", "4", pipeline="qwen3-tts")
    message = str(refused.value)
    assert "stages.vocoder.factory: 'max_batch_sise' is not a setting of this stage's factory" in (
        message
    )
    assert "did you mean: max_batch_size" in message
    assert "(set by --vocoder.factory.max_batch_sise)" in message


def test_factory_args_that_allow_extras_pass_them_through():
    from omni_core import FactoryArgs

    class Strict(FactoryArgs):
        size: int = 1

    class Open(Strict):
        allow_extra_keys = True

    assert Open(size=2, extra=3).free_keys() == {"extra": 3}
    with pytest.raises(ValueError, match="'extra' is not a setting"):
        Strict(extra=3)


def test_int_into_float_field_is_fine(resolve):
    res = resolve(None, "--tts_engine.engine.mem_fraction_static", "1", pipeline="qwen3-tts")
    value = res.config.stage("tts_engine").engine.mem_fraction_static
    assert value == 1.0 and isinstance(value, float)


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--tts_engine.tp_size", "1.0", "expected an integer"),
        ("--tts_engine.tp_size", "true", "expected an integer"),
        ("--tts_engine.gpu_memory_fraction", "true", "expected a number"),
        ("--mps", "maybe", "one of 'off', 'on', 'auto'"),
        ("--processes.pipeline.num_replicas", "two", "expected an integer"),
        ("--vocoder.factory.chunk_frames", "1.5", "expected an integer"),
    ],
)
def test_lossy_flag_values_are_refused(resolve, flag, value, expected):
    with pytest.raises(ConfigError) as info:
        resolve(None, flag, value, pipeline="qwen3-tts")
    assert expected in str(info.value)
    assert flag in str(info.value)


def test_bool_and_float_in_a_file_never_land_in_numbers(deploy, resolve):
    path = deploy('pipeline = "qwen3-tts"\n[stages.tts_engine]\ntp_size = true\n')
    with pytest.raises(ConfigError) as info:
        resolve(path)
    assert f"{path}:3" in str(info.value) and "expected an integer" in str(info.value)
    path = deploy('pipeline = "qwen3-tts"\n[stages.vocoder.factory]\nchunk_frames = 2.0\n')
    with pytest.raises(ConfigError, match="expected an integer"):
        resolve(path)


def test_none_means_null(resolve):
    res = resolve(None, "--code2wav.gpu_memory_fraction", "none", pipeline="qwen3-omni")
    assert res.config.stage("code2wav").gpu_memory_fraction is None
    res = resolve(None, "--vocoder.gpu", "none", pipeline="qwen3-tts")
    assert res.config.stage("vocoder").gpu is None


def test_gpu_accepts_an_id_or_a_list(deploy, resolve):
    res = resolve(None, "--thinker.tp_size", "2", "--thinker.gpu", "0,1", pipeline="qwen3-omni")
    assert res.config.stage("thinker").gpu == [0, 1]
    res = resolve(None, "--thinker.tp_size", "2", "--thinker.gpu", "[2, 3]", pipeline="qwen3-omni")
    assert res.config.stage("thinker").gpu == [2, 3]
    # A deploy file may write the list as a string too: coercion reads it the same way.
    path = deploy('pipeline = "qwen3-omni"\n\n[stages.thinker]\ntp_size = 2\ngpu = "0,1"\n')
    assert resolve(path).config.stage("thinker").gpu == [0, 1]
    for written in ('"0,one"', '"zero"'):
        path = deploy(f'pipeline = "qwen3-omni"\n\n[stages.thinker]\ngpu = {written}\n')
        with pytest.raises(
            ConfigError, match=r"stages\.thinker\.gpu: expected an integer or a list"
        ):
            resolve(path)
    with pytest.raises(ConfigError, match=r"stages\.thinker\.gpu: expected") as info:
        resolve(None, "--thinker.gpu", "0,one", pipeline="qwen3-omni")
    assert info.value.origin == "--thinker.gpu"


def test_constraint_errors_name_the_path_and_the_origin(deploy, resolve):
    path = deploy('pipeline = "qwen3-tts"\n\n[stages.vocoder]\ngpu_memory_fraction = 1.5\n')
    with pytest.raises(ConfigError) as info:
        resolve(path)
    message = str(info.value)
    assert "stage 'vocoder'" in message and "gpu_memory_fraction" in message
    assert f"set by {path}:4" in message
    with pytest.raises(ConfigError) as info:
        resolve(deploy(SEED), "--processes.pipeline.num_replicas", "0")
    assert "num_replicas must be >= 1" in str(info.value)
    assert "--processes.pipeline.num_replicas" in str(info.value)


def test_refusals_are_the_schemas_lines_with_their_origins(deploy, resolve, plugins):
    """Users read exactly the lines the schema tests check, each followed by its origin."""
    text = "[stages.vocoder]\ngpu_memory_fraction = 0.5\ntotal_reserve_bytes = 4096\n"
    path = deploy(f'pipeline = "qwen3-tts"\n\n{text}')
    with pytest.raises(ConfigError) as info:
        resolve(path)
    vocoder = plugins.pipeline("qwen3-tts")().stage("vocoder")
    data = {**vocoder.model_dump(), "gpu_memory_fraction": 0.5, "total_reserve_bytes": 4096}
    with pytest.raises(ValidationError) as raw:
        type(vocoder).model_validate(data)
    lines = validation_message(raw.value).splitlines()
    assert any("exclusive" in line for line in lines)
    assert str(info.value).splitlines() == [
        "invalid deployment:",
        *(f"  {line} (set by {path}:4, {path}:5)" for line in lines),
    ]


def test_validated_value_is_shown_when_validation_changed_it(resolve):
    from omni_core.config.render import explain

    res = resolve(None, "--tts_engine.total_reserve_bytes", "2GiB", pipeline="qwen3-tts")
    text = explain(res.record(("stages", "tts_engine", "total_reserve_bytes")))
    lines = [line.split() for line in text.splitlines()]
    assert lines[0] == ["stages.tts_engine.total_reserve_bytes", "=", "2147483648"]
    assert lines[2] == ['"2GiB"', "<-", "--tts_engine.total_reserve_bytes", "[winner]"]
    assert lines[3] == ["2147483648", "<-", "after", "validation"]


def test_coerce_unit_rules():
    assert coerce("none", int | None, from_text=True) is None
    assert coerce(3, float, from_text=False) == 3.0
    with pytest.raises(ValueError):
        coerce(True, int, from_text=False)
    with pytest.raises(ValueError):
        coerce(2.5, int, from_text=False)
