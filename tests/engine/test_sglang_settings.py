"""``engine.backend = "sglang"``: SGLang's ServerArgs as engine.*, checked without SGLang.

These run in the default suite (SGLang is not imported; the key table is
generated from the pinned version) and again under ``make test-sglang``,
where ``tools/gen_sglang_args.py --check`` also proves the table current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from omni_core.cli import main
from omni_core.engine.backends import validate_engine_settings
from omni_core.engine.sglang_args import SERVER_ARGS, SGLANG_VERSION
from omni_core.engine.sglang_engine import SGLangEngine, device_args
from omni_core.engine.sglang_settings import OMNI_DEFAULTS, OMNI_OWNED, describe_key
from omni_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "qwen3_omni_text_demo.toml"
SGLANG = ("--thinker.engine.backend", "sglang")


@pytest.fixture
def fresh_plugins(plugins):
    yield plugins


def test_the_table_is_the_pinned_sglang_serverargs() -> None:
    assert SGLANG_VERSION == "0.5.23"
    for key in (
        "mem_fraction_static",
        "max_running_requests",
        "chunked_prefill_size",
        "enable_torch_compile",
        "disable_cuda_graph",
        "cuda_graph_max_bs_decode",
    ):
        assert key in SERVER_ARGS
    requirements = (ROOT / "tests/support/sglang/requirements.txt").read_text()
    assert f"sglang=={SGLANG_VERSION}" in (ROOT / "Makefile").read_text()
    assert "torch==2.14.1" in requirements


def test_the_seeds_engine_keys_are_accepted_and_passed_on() -> None:
    settings = validate_engine_settings(
        "asr",
        {
            "backend": "sglang",
            "max_running_requests": "16",  # flags arrive as text
            "cuda_graph_max_bs": 8,  # the seed's spelling, SGLang 0.5.23's decode field
            "mem_fraction_static": 0.6,
            "enable_torch_compile": True,
        },
    )
    args = settings.server_args()
    assert args["max_running_requests"] == 16
    assert args["cuda_graph_max_bs_decode"] == 8 and "cuda_graph_max_bs" not in args
    assert args["mem_fraction_static"] == 0.6 and args["enable_torch_compile"] is True
    # what omni's planner reads has the torch backend's defaults, passed to SGLang too
    assert args["max_total_tokens"] == OMNI_DEFAULTS["max_total_tokens"]


def test_an_unknown_key_is_refused_with_the_closest_serverargs_field() -> None:
    with pytest.raises(ConfigError) as info:
        validate_engine_settings("thinker", {"backend": "sglang", "chunked_prefil_size": 512})
    message = str(info.value)
    assert "engine.chunked_prefil_size is not a setting of the 'sglang' engine backend" in message
    assert "did you mean: chunked_prefill_size?" in message
    assert f"SGLang {SGLANG_VERSION}'s ServerArgs" in message
    assert len(message) < 600  # the closest name, not 500 of them


def test_a_wrong_type_is_refused_with_its_key() -> None:
    with pytest.raises(ConfigError, match=r"engine\.enable_torch_compile"):
        validate_engine_settings("thinker", {"backend": "sglang", "enable_torch_compile": "maybe"})


@pytest.mark.parametrize("key", sorted(OMNI_OWNED))
def test_keys_omni_sets_itself_are_refused_saying_where_they_come_from(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_engine_settings("thinker", {"backend": "sglang", key: "x"})
    assert f"engine.{key} is set by omni on the sglang backend" in str(info.value)
    assert OMNI_OWNED[key] in str(info.value)


def test_both_spellings_of_one_setting_are_refused() -> None:
    with pytest.raises(ConfigError, match="are the same setting"):
        validate_engine_settings(
            "t", {"backend": "sglang", "cuda_graph_max_bs": 4, "cuda_graph_max_bs_decode": 8}
        )


def test_omni_plan_exits_2_on_a_typo_with_did_you_mean(fresh_plugins, capsys) -> None:
    code = main(["plan", str(DEMO), *SGLANG, "--thinker.engine.cuda_graph_max_bz", "4"])
    err = capsys.readouterr().err
    assert code == 2
    assert "did you mean: cuda_graph_max_bs_decode?" in err
    assert "(set by --thinker.engine.cuda_graph_max_bz)" in err


def test_omni_plan_accepts_the_seeds_asr_style_keys(fresh_plugins, capsys) -> None:
    flags = [*SGLANG]
    for key, value in (
        ("max_running_requests", "16"),
        ("cuda_graph_max_bs", "8"),
        ("mem_fraction_static", "0.6"),
        ("enable_torch_compile", "true"),
    ):
        flags += [f"--thinker.engine.{key}", value]
    assert main(["plan", str(DEMO), *flags]) == 0, capsys.readouterr().err


def test_a_contradiction_with_placement_names_both_origins(fresh_plugins, capsys) -> None:
    code = main(["plan", str(DEMO), *SGLANG, "--thinker.engine.tp_size", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert "engine.tp_size 2 contradicts the stage's tp_size 1" in err
    assert "--thinker.engine.tp_size" in err
    code = main(
        [
            "plan",
            str(DEMO),
            *SGLANG,
            "--thinker.gpu_memory_fraction",
            "0.4",
            "--thinker.engine.mem_fraction_static",
            "0.5",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "engine.mem_fraction_static 0.5 contradicts the stage's gpu_memory_fraction 0.4" in err
    assert "--thinker.engine.mem_fraction_static" in err and "--thinker.gpu_memory_fraction" in err


def test_config_explain_says_how_sglang_reads_a_key(fresh_plugins, capsys) -> None:
    args = [
        "config",
        "explain",
        str(DEMO),
        "stages.thinker.engine.cuda_graph_max_bs",
        *SGLANG,
        "--thinker.engine.cuda_graph_max_bs",
        "8",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "passed to SGLang 0.5.23 as ServerArgs.cuda_graph_max_bs_decode" in out
    assert "read by SGLang 0.5.23 as ServerArgs.chunked_prefill_size" in describe_key(
        "chunked_prefill_size"
    )
    assert "set by omni" in describe_key("model_path")


def test_serving_without_sglang_installed_exits_2_naming_the_install_step(
    fresh_plugins, capsys, monkeypatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a)
    )
    code = main(["serve", str(DEMO), *SGLANG, "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert "runs on the 'sglang' engine backend, but sglang is not installed" in err
    assert sys.executable in err and "make sglang-env" in err


def test_the_engine_passes_placement_settings_and_the_model_launch_to_sglang() -> None:
    class Model:
        def launch(self):
            return {"model_path": "/ckpt", "skip_tokenizer_init": True}, {"X": "1"}

    settings = validate_engine_settings(
        "thinker", {"backend": "sglang", "chunked_prefill_size": 64}
    )
    args, env = SGLangEngine(Model(), settings, device="cpu").server_args()
    assert args["device"] == "cpu" and args["attention_backend"] == "torch_native"
    assert args["disable_cuda_graph"] is True  # no CUDA graphs without CUDA
    assert args["chunked_prefill_size"] == 64 and args["model_path"] == "/ckpt"
    assert env == {"X": "1"}
    gpu = device_args("cuda:1")
    assert gpu == {"device": "cuda", "base_gpu_id": 1}  # SGLang picks its kernels and graphs
    json.dumps(args)  # everything SGLang gets is plain data
