"""Memory estimates: the core arithmetic and the model plugins' hook."""

from __future__ import annotations

import json

import pytest

from omni_core import EngineArgs
from omni_core.engine.backends import validate_engine_settings
from omni_core.engine.interface import EngineSettings
from omni_core.errors import ConfigError
from omni_core.placement import MemoryEstimate
from omni_core.plan.estimates import (
    collect_estimates,
    decoder_params,
    dtype_bytes,
    kv_bytes_per_token,
    read_local_config,
    shape_from_config,
)
from omni_moss_tts import memory as moss_memory
from omni_moss_tts.pipeline import MossTTSPipeline
from omni_qwen3_omni import memory as qwen3_omni_memory
from omni_qwen3_omni.pipeline import Qwen3OmniSpeechPipeline, Qwen3OmniTextPipeline
from omni_qwen3_tts import memory as qwen3_tts_memory
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

GiB = 1024**3


def test_dtype_bytes():
    assert dtype_bytes("bfloat16") == 2
    assert dtype_bytes("torch.float32") == 4
    assert dtype_bytes("auto") == 2
    assert dtype_bytes("BF16") == 2
    with pytest.raises(ConfigError, match="unknown dtype 'float13'"):
        dtype_bytes("float13")


def test_dense_and_moe_parameter_counts():
    # Qwen3-8B-like: about 8.2B parameters with untied embeddings
    dense = decoder_params(
        layers=36,
        hidden=4096,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=12288,
        vocab=151936,
        tied_embeddings=False,
    )
    assert 8.0e9 < dense < 8.4e9
    # Qwen3-30B-A3B-like thinker: about 30.5B parameters
    moe = decoder_params(
        layers=48,
        hidden=2048,
        heads=32,
        kv_heads=4,
        head_dim=128,
        experts=128,
        moe_intermediate=768,
        vocab=152064,
        tied_embeddings=False,
    )
    assert 30.0e9 < moe < 31.0e9


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(layers=48, kv_heads=4, head_dim=128) == 2 * 48 * 4 * 128 * 2
    bf16 = kv_bytes_per_token(layers=48, kv_heads=4, head_dim=128, dtype="bfloat16")
    fp32 = kv_bytes_per_token(layers=48, kv_heads=4, head_dim=128, dtype="float32")
    assert fp32 == 2 * bf16
    with pytest.raises(ConfigError, match="unknown dtype 'float13'"):
        kv_bytes_per_token(layers=1, kv_heads=1, head_dim=1, dtype="float13")


def test_shape_from_config_spellings():
    base = {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 4, "head_dim": 16, "experts": 0}
    shape = shape_from_config(
        {
            "num_hidden_layers": 3,
            "hidden_size": 256,
            "num_attention_heads": 8,
            "num_local_experts": 16,
        },
        base,
    )
    assert shape == {
        "layers": 3,
        "hidden": 256,
        "heads": 8,
        "kv_heads": 4,
        "head_dim": 32,
        "experts": 16,
    }


def test_read_local_config(tmp_path):
    assert read_local_config("Qwen/Qwen3-TTS-12Hz-0.6B-Base") is None
    assert read_local_config(str(tmp_path)) is None
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        read_local_config(str(tmp_path))


def test_every_shipped_gpu_stage_is_estimated(plugins):
    for cls in (Qwen3TTSPipeline, MossTTSPipeline, Qwen3OmniSpeechPipeline, Qwen3OmniTextPipeline):
        config = cls()
        estimates = collect_estimates(config, plugins)
        gpu_stages = {s.name for s in config.stages if s.gpu is not None}
        assert set(estimates) == gpu_stages, cls.pipeline_name
        assert all(isinstance(e, MemoryEstimate) for e in estimates.values())


def test_qwen3_tts_sizes_and_settings(plugins, configure):
    small = collect_estimates(Qwen3TTSPipeline(), plugins)["tts_engine"]
    large = collect_estimates(
        Qwen3TTSPipeline(model_path="Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"), plugins
    )["tts_engine"]
    assert 1.5 * GiB < small.weights_bytes < 2.2 * GiB
    assert large.weights_bytes > 1.8 * small.weights_bytes
    engine = Qwen3TTSPipeline().stage("tts_engine")
    fewer = configure(
        Qwen3TTSPipeline, {"tts_engine": {"engine": EngineArgs(max_total_tokens=1024)}}
    )
    assert collect_estimates(fewer, plugins)["tts_engine"].kv_bytes == 1024 * 2 * 28 * 8 * 128 * 2
    factory = engine.factory.model_copy(update={"dtype": "float32"})
    fp32 = configure(Qwen3TTSPipeline, {"tts_engine": {"factory": factory}})
    assert collect_estimates(fp32, plugins)["tts_engine"].weights_bytes == 2 * small.weights_bytes


ENGINE_STAGES = [
    (Qwen3TTSPipeline, "tts_engine", qwen3_tts_memory.TALKERS["0.6B"]),
    (MossTTSPipeline, "tts_engine", moss_memory.BACKBONE),
    (Qwen3OmniSpeechPipeline, "thinker", qwen3_omni_memory.THINKER),
    (Qwen3OmniSpeechPipeline, "talker_ar", qwen3_omni_memory.TALKER),
]


@pytest.mark.parametrize(
    "cls, stage, shape", ENGINE_STAGES, ids=[f"{c.pipeline_name}-{s}" for c, s, _ in ENGINE_STAGES]
)
def test_engine_kv_follows_the_dtype_and_the_backend_default(plugins, configure, cls, stage, shape):
    # unset engine.max_total_tokens: the backend's declared default, as the engine uses it
    default_tokens = EngineSettings.model_fields["max_total_tokens"].default
    assert validate_engine_settings(stage, {}).max_total_tokens == default_tokens
    per_token_bf16 = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * 2
    bf16 = collect_estimates(cls(), plugins)[stage]
    assert bf16.kv_bytes == default_tokens * per_token_bf16
    assert f"bfloat16, KV for {default_tokens} tokens" in bf16.source
    # factory.dtype = float32: the engine keeps weights and KV cache in float32
    factory = cls().stage(stage).factory.model_copy(update={"dtype": "float32"})
    fp32 = collect_estimates(configure(cls, {stage: {"factory": factory}}), plugins)[stage]
    assert fp32.kv_bytes == 2 * bf16.kv_bytes
    assert fp32.weights_bytes == 2 * bf16.weights_bytes
    assert f"float32, KV for {default_tokens} tokens" in fp32.source
    # a written budget replaces the default
    written = configure(cls, {stage: {"engine": EngineArgs(max_total_tokens=512)}})
    assert collect_estimates(written, plugins)[stage].kv_bytes == 512 * per_token_bf16


def test_an_engine_group_the_backend_refuses_fails_the_estimate(plugins, configure):
    typo = configure(
        Qwen3TTSPipeline, {"tts_engine": {"engine": EngineArgs(max_runing_requests=8)}}
    )
    with pytest.raises(ConfigError, match=r"engine\.max_runing_requests is not a setting"):
        collect_estimates(typo, plugins)


def test_unknown_checkpoint_is_not_estimated(plugins):
    estimates = collect_estimates(Qwen3TTSPipeline(model_path="someone/custom-tts"), plugins)
    assert "tts_engine" not in estimates
    assert "vocoder" in estimates


def test_local_config_json_is_read(plugins, tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"talker_config": {"num_hidden_layers": 2, "hidden_size": 1024}})
    )
    tiny = collect_estimates(Qwen3TTSPipeline(model_path=str(tmp_path)), plugins)["tts_engine"]
    full = collect_estimates(Qwen3TTSPipeline(), plugins)["tts_engine"]
    assert tiny.weights_bytes < full.weights_bytes
    assert str(tmp_path) in tiny.source


def test_omni_estimates_follow_the_checkpoint_parts(plugins):
    estimates = collect_estimates(Qwen3OmniSpeechPipeline(), plugins)
    assert estimates["thinker"].weights_bytes > 55 * GiB
    assert estimates["talker_ar"].kv_bytes > 0
    assert estimates["audio_encoder"].kv_bytes == 0
    # the codec's 0.8 GB of weights, its chunks, 32 streams' state and its CUDA graphs
    code2wav = estimates["code2wav"]
    assert 2 * GiB < code2wav.total_bytes < 4 * GiB
    assert "CUDA graphs" in code2wav.source and "streams' state" in code2wav.source


def test_estimate_hook_is_documented_and_listed(plugins):
    from omni_core import hookspecs

    assert "omni_estimate_memory" in (hookspecs.__doc__ or "")
    assert hookspecs.omni_estimate_memory.__doc__
    row = next(
        r
        for r in plugins.listing()
        if "omni_qwen3_tts" in str(r["hooks"]) or r["name"] == "omni-qwen3-tts"
    )
    assert "omni_estimate_memory" in row["hooks"]


@pytest.mark.parametrize(
    "cls, stage",
    [(c, s) for c, s, _ in ENGINE_STAGES],
    ids=[f"{c.pipeline_name}-{s}" for c, s, _ in ENGINE_STAGES],
)
def test_a_preset_is_estimated_from_its_own_config(plugins, cls, stage):
    # The tiny demos used to be estimated at the release's size (Qwen3-Omni's thinker at
    # 56.87 GiB), and the plan's cache check then refused the demo on a GPU.
    release = collect_estimates(cls(), plugins)[stage]
    tiny = collect_estimates(cls(model_path="tiny"), plugins)[stage]
    assert tiny.weights_bytes < 200 * 1024**2 < release.weights_bytes
    assert tiny.source.startswith("tiny/config.json") and tiny.kv_bytes_per_token > 0
    assert tiny.max_positions and release.max_positions


def test_vocoder_stages_reserve_their_streams_chunks_and_graphs(plugins, configure):
    """Each streaming codec's overhead is counted from its geometry and its factory."""
    from omni_moss_tts.codec_footprint import RELEASE_DECODER, codec_footprint
    from omni_qwen3_tts.codec_footprint import PROCESS_SLACK

    moss = collect_estimates(MossTTSPipeline(), plugins)["vocoder"]
    footprint = codec_footprint(RELEASE_DECODER, 4)
    assert 165e6 < footprint.state_bytes < 175e6  # about 170 MB a release stream in float32
    # 16 streams, each call a whole batch (its state's next one beside it), and graphs of
    # at most 8 rows sharing one tensor of full windows (codec/graphs.py)
    batch = footprint.chunk_bytes(16, 48) + 16 * footprint.state_bytes
    shapes = [(r, t) for r in (1, 2, 4, 8) for t in (2, 8, 32, 48) if r * t <= 64]
    graphs = footprint.graph_bytes(shapes)
    assert 8 * footprint.state_bytes < graphs < 8 * footprint.state_bytes + 0.2 * GiB
    assert moss.overhead_bytes == PROCESS_SLACK + batch + graphs
    assert "in calls of 16" in moss.source and "CUDA graphs 1.4" in moss.source
    factory = MossTTSPipeline().stage("vocoder").factory
    eager = factory.model_copy(update={"disable_cuda_graph": True})
    plain = collect_estimates(configure(MossTTSPipeline, {"vocoder": {"factory": eager}}), plugins)
    assert plain["vocoder"].overhead_bytes == PROCESS_SLACK + batch
    assert "CUDA graphs" not in plain["vocoder"].source
    # factory.cuda_graph_max_bs = 16: the shared windows are 16 rows tall
    tall = factory.model_copy(update={"cuda_graph_max_bs": 16})
    taller = collect_estimates(configure(MossTTSPipeline, {"vocoder": {"factory": tall}}), plugins)
    sixteen = [(r, t) for r in (1, 2, 4, 8, 16) for t in (2, 8, 32, 48) if r * t <= 64]
    wide = codec_footprint(RELEASE_DECODER, 4, captured_rows=16).graph_bytes(sixteen)
    assert taller["vocoder"].overhead_bytes == PROCESS_SLACK + batch + wide
    assert wide - graphs >= 8 * footprint.state_bytes
    assert "CUDA graphs 2.7" in taller["vocoder"].source

    tts = collect_estimates(Qwen3TTSPipeline(), plugins)["vocoder"]
    assert "in calls of 5" in tts.source and "CUDA graphs" in tts.source
    factory = Qwen3TTSPipeline().stage("vocoder").factory
    eager = factory.model_copy(update={"disable_cuda_graph": True, "max_batch_size": 4})
    smaller = collect_estimates(
        configure(Qwen3TTSPipeline, {"vocoder": {"factory": eager}}), plugins
    )
    assert "CUDA graphs" not in smaller["vocoder"].source
    assert smaller["vocoder"].overhead_bytes < tts.overhead_bytes - 0.8 * GiB
    # a stream for each request the engine that feeds the vocoder runs, beyond a batch's
    busy = configure(
        MossTTSPipeline, {"tts_engine": {"engine": EngineArgs(max_running_requests=32)}}
    )
    more = collect_estimates(busy, plugins)["vocoder"]
    assert more.overhead_bytes - moss.overhead_bytes == 16 * footprint.state_bytes
    assert "32 streams' state" in more.source and "16 streams' state" in moss.source


def test_the_codecs_weights_are_counted_from_their_configs(tmp_path):
    """code2wav's 216 M at the release's config (the planner took 200 M before) and a
    smaller one's, and Qwen3-TTS's tokenizer at the release's config equal to the count
    its hub id is given."""
    torch = pytest.importorskip("torch")
    import sys
    from pathlib import Path

    from omni_qwen3_omni.code2wav.model import Code2Wav
    from omni_qwen3_tts.codec_params import speech_decoder_params, speech_encoder_params

    for section in (None, {"num_hidden_layers": 2, "decoder_dim": 768, "hidden_size": 512}):
        with torch.device("meta"):
            module = Code2Wav(qwen3_omni_memory.code2wav_config(section))
        held = sum(t.numel() for t in module.state_dict().values())
        assert qwen3_omni_memory.code2wav_params(section) == held
    assert qwen3_omni_memory.code2wav_params(None) == 216_016_577

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_qwen3_tts import write_configs  # the release's configs, as published

    write_configs(tmp_path, 48)
    release = qwen3_tts_memory.codec_config(str(tmp_path))
    assert release is not None
    counted = speech_decoder_params(release.decoder) + speech_encoder_params(release.encoder)
    assert counted == qwen3_tts_memory.SPEECH_TOKENIZER_PARAMS
