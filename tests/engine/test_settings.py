"""``engine.*`` settings: the backend registry, validation at planning, and cache sizing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omni_core.cli import main
from omni_core.engine.backends import (
    backend_names,
    create_engine,
    get_backend,
    validate_engine_settings,
)
from omni_core.engine.budget import bytes_per_token, dtype_bytes, plan_slots
from omni_core.engine.interface import CacheLayout, EngineSettings
from omni_core.engine.torch_engine import TorchEngine
from omni_core.engine.toy_model import TinyDecoder
from omni_core.errors import ConfigError

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.toml"))
TTS = next(p for p in EXAMPLES if p.stem == "qwen3_tts")
ACCEPTED = (
    "backend, chunked_prefill_size, cpu_weight_prepack, cuda_graph_max_bs, device, "
    "disable_cuda_graph, disable_radix_cache, enable_torch_compile, max_prefill_tokens, "
    "max_running_requests, max_total_tokens, mem_fraction_static"
)


def test_the_torch_backend_accepts_its_declared_keys() -> None:
    settings = validate_engine_settings(
        "tts_engine", {"max_running_requests": 16, "mem_fraction_static": 0.6}
    )
    assert isinstance(settings, EngineSettings)
    assert (settings.backend, settings.max_running_requests) == ("torch", 16)
    assert settings.mem_fraction_static == 0.6


def test_an_unknown_key_is_refused_naming_it_and_the_accepted_ones() -> None:
    with pytest.raises(ConfigError) as info:
        validate_engine_settings("tts_engine", {"max_runing_requests": 8})
    message = str(info.value)
    assert "stage 'tts_engine': engine.max_runing_requests is not a setting" in message
    assert f"accepted engine.* keys: {ACCEPTED}" in message
    assert "did you mean: max_running_requests" in message
    assert info.value.exit_code == 2


def test_engine_dtype_is_refused_since_the_cache_follows_the_model_dtype() -> None:
    # nothing read engine.dtype: it is refused instead of silently doing nothing
    with pytest.raises(ConfigError) as info:
        validate_engine_settings("tts_engine", {"dtype": "float32"})
    assert "engine.dtype is not a setting of the 'torch' engine backend" in str(info.value)
    assert f"accepted engine.* keys: {ACCEPTED}" in str(info.value)


def test_a_value_out_of_range_is_refused_with_its_key() -> None:
    with pytest.raises(ConfigError, match=r"engine\.max_prefill_tokens: must be >= 1, got 0"):
        validate_engine_settings("s", {"max_prefill_tokens": 0})


def test_backends_are_looked_up_by_name() -> None:
    assert backend_names() == ["sglang", "torch"]
    assert validate_engine_settings("thinker", {"backend": "sglang"}).backend == "sglang"
    with pytest.raises(ConfigError, match=r"unknown engine backend 'vllm'.*sglang, torch"):
        get_backend("vllm")


def test_create_engine_builds_the_selected_backend() -> None:
    settings = EngineSettings(max_running_requests=2, max_total_tokens=32)
    engine = create_engine(TinyDecoder(), settings)
    assert isinstance(engine, TorchEngine)
    assert (engine.plan.num_slots, engine.plan.slot_len) == (2, 16)


# -- through the planner and the CLI ------------------------------------------


@pytest.fixture
def fresh_plugins(plugins):
    """The CLI uses the process-wide plugin manager; reset it around the test."""
    yield plugins


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_shipped_example_still_plans(example: Path, fresh_plugins, capsys) -> None:
    assert main(["plan", str(example)]) == 0, capsys.readouterr().err


def test_a_typo_in_an_engine_flag_fails_omni_plan_with_exit_2(fresh_plugins, capsys) -> None:
    code = main(["plan", str(TTS), "--tts_engine.engine.max_runing_requests", "8"])
    err = capsys.readouterr().err
    assert code == 2
    assert "engine.max_runing_requests is not a setting of the 'torch' engine backend" in err
    assert ACCEPTED in err
    assert "did you mean: max_running_requests" in err


def test_a_stage_whose_factory_cannot_drive_sglang_refuses_it(fresh_plugins, capsys) -> None:
    assert main(["plan", str(TTS), "--tts_engine.engine.backend", "sglang"]) == 2
    err = capsys.readouterr().err
    assert "stage 'tts_engine' cannot run on the 'sglang' engine backend" in err
    assert "its factory drives 'torch'" in err


def test_a_correct_engine_flag_plans(fresh_plugins, capsys) -> None:
    code = main(["plan", str(TTS), "--tts_engine.engine.max_prefill_tokens", "4096", "--json"])
    assert code == 0, capsys.readouterr().err


def test_planning_with_engine_checks_imports_no_torch(shipped_plugins_env) -> None:
    script = (
        "import json, sys\n"
        "from omni_core.cli import main\n"
        f"code = main(['plan', {str(TTS)!r}, '--tts_engine.engine.max_running_requests', '4'])\n"
        "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}))\n"
    )
    # the shipped plugins only: a developer's own plugin may import torch at will
    env = shipped_plugins_env
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"code": 0, "torch": False}


# -- sizing the cache -----------------------------------------------------------

LAYOUT = CacheLayout(2, 4, 16, torch.bfloat16, torch.device("cpu"))


def test_bytes_per_position_counts_keys_values_layers_heads() -> None:
    assert dtype_bytes(torch.bfloat16) == dtype_bytes("bfloat16") == 2
    assert dtype_bytes(torch.float32) == dtype_bytes("torch.float32") == 4
    assert bytes_per_token(LAYOUT) == 2 * 2 * 4 * 16 * 2
    fp32 = CacheLayout(2, 4, 16, torch.float32, torch.device("cpu"))
    assert bytes_per_token(fp32) == 2 * bytes_per_token(LAYOUT)
    with pytest.raises(ValueError, match="unknown dtype 'float13'"):
        dtype_bytes("float13")


def test_the_planner_sizes_the_cache_with_the_engine_table() -> None:
    from omni_core.plan import estimates

    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        name = str(dtype)
        assert estimates.dtype_bytes(name) == dtype_bytes(dtype)
        assert estimates.kv_bytes_per_token(
            layers=2, kv_heads=4, head_dim=16, dtype=name
        ) == bytes_per_token(CacheLayout(2, 4, 16, dtype, torch.device("cpu")))


def test_slots_split_max_total_tokens() -> None:
    plan = plan_slots(EngineSettings(max_running_requests=8, max_total_tokens=1000), LAYOUT)
    assert (plan.num_slots, plan.slot_len, plan.source) == (8, 125, "max_total_tokens")


def test_a_memory_share_sizes_the_cache_when_the_device_memory_is_known() -> None:
    settings = EngineSettings(max_running_requests=4, mem_fraction_static=0.5)
    plan = plan_slots(settings, LAYOUT, device_memory=1_000_000, used_memory=100_000)
    assert plan.source == "memory"
    assert plan.slot_len == (400_000 // 512) // 4
    # without the device's memory (CPU), or with max_total_tokens written, the tokens decide
    assert plan_slots(settings, LAYOUT).source == "max_total_tokens"
    written = EngineSettings(max_running_requests=4, mem_fraction_static=0.5, max_total_tokens=64)
    assert plan_slots(written, LAYOUT, device_memory=1_000_000).slot_len == 16


def test_a_cache_sized_from_memory_gives_no_slot_more_than_the_model_takes() -> None:
    capped = CacheLayout(2, 4, 16, torch.bfloat16, torch.device("cpu"), max_positions=100)
    settings = EngineSettings(max_running_requests=4, mem_fraction_static=0.5)
    plan = plan_slots(settings, capped, device_memory=1_000_000, used_memory=100_000)
    assert (plan.slot_len, plan.source) == (100, "memory, capped at max_position_embeddings")
    roomy = CacheLayout(2, 4, 16, torch.bfloat16, torch.device("cpu"), max_positions=10_000)
    assert plan_slots(settings, roomy, device_memory=1_000_000).source == "memory"
    # a written max_total_tokens is the user's word: not capped
    written = EngineSettings(max_running_requests=1, max_total_tokens=500)
    assert plan_slots(written, capped).slot_len == 500
    config = type("Config", (), dict(num_hidden_layers=2, num_key_value_heads=4, head_dim=16))
    assert CacheLayout.of(config, torch.float32, "cpu").max_positions is None
    config.max_position_embeddings = 32768
    assert CacheLayout.of(config, torch.float32, "cpu", tp_size=2).max_positions == 32768


def test_budgets_too_small_for_one_position_per_slot_are_refused() -> None:
    with pytest.raises(ConfigError, match="leaves 0 bytes for the KV cache"):
        plan_slots(
            EngineSettings(mem_fraction_static=0.1),
            LAYOUT,
            device_memory=1_000_000,
            used_memory=200_000,
        )
    with pytest.raises(ConfigError, match="cannot give each of"):
        plan_slots(EngineSettings(max_running_requests=8, max_total_tokens=4), LAYOUT)


def test_admission_defaults_to_what_the_engine_runs(plugins):
    """With nothing set, admission lets in what the engines run at once, per replica."""
    from omni_core.engine.interface import EngineSettings
    from omni_core.plan.admission import admission_limit
    from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

    default = EngineSettings().max_running_requests
    assert admission_limit(Qwen3TTSPipeline(), {"pipeline": 1}) == default
    assert admission_limit(Qwen3TTSPipeline(), {"pipeline": 3}) == 3 * default
    from omni_core.config import load_deployment

    flags = ["--tts_engine.engine.max_running_requests", "5"]
    written = load_deployment(None, flags, pipeline="qwen3-tts", plugins=plugins).config
    assert admission_limit(written, {"pipeline": 2}) == 10


def test_the_plan_shows_the_admission_limit_the_runtime_enforces():
    """`omni plan` prints the number before serving: replicas times the engine's limit."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    deploy = Path(__file__).parents[2] / "examples" / "qwen3_tts.toml"
    flags = ["--gpus", "1", "--gpu-memory", "80GiB", "--no-detect"]
    command = [sys.executable, "-m", "omni_core", "plan", str(deploy), *flags]
    written = [
        "--tts_engine.engine.max_running_requests",
        "5",
        "--processes.pipeline.num_replicas",
        "2",
        "--processes.pipeline.replica_devices",
        "0,0",
        "--tts_engine.gpu_memory_fraction",
        "0.3",
        "--vocoder.gpu_memory_fraction",
        "0.1",
    ]
    plain = subprocess.run([*command, "--json"], capture_output=True, text=True, check=True)
    capped = subprocess.run([*command, *written, "--json"], capture_output=True, text=True)
    # unwritten, the engine's limit is the one the plan sized from the GPU's memory
    sized = json.loads(plain.stdout)["running_requests"]["tts_engine"]
    assert sized > 8 and json.loads(plain.stdout)["admission_limit"] == sized, plain.stderr
    assert capped.returncode == 0, capped.stderr
    assert json.loads(capped.stdout)["admission_limit"] == 10
    text = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert f"admission: at most {sized} requests in flight" in text


def test_a_cache_layout_reads_a_decoder_config_and_splits_its_kv_heads_over_ranks():
    from types import SimpleNamespace

    from omni_core.engine.interface import CacheLayout

    config = SimpleNamespace(num_hidden_layers=4, num_key_value_heads=8, head_dim=64)
    assert CacheLayout.of(config, "bf16", "cpu") == CacheLayout(4, 8, 64, "bf16", "cpu")
    assert CacheLayout.of(config, "bf16", "cpu", tp_size=2).num_kv_heads == 4
