"""Preprocessing checks, the watchdog, and plan-time refusals of bad model and codec paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

torch = pytest.importorskip("torch")

from omni_core import RequestError  # noqa: E402
from omni_moss_tts.model import MAX_TEXT_STEPS, MossTTSModel  # noqa: E402
from omni_moss_tts.pipeline import MossTTSPipeline  # noqa: E402
from omni_moss_tts.source import PRESETS_DIR, codec_reference, resolve_codec  # noqa: E402
from omni_moss_tts.stages import Preprocessing  # noqa: E402


@pytest.fixture(scope="module")
def pre() -> Preprocessing:
    return Preprocessing("tiny", max_ref_audio_seconds=10.0, max_frames=50)


def run(pre: Preprocessing, **data):
    return anyio.run(pre.run, SimpleNamespace(data=data))


def test_a_plain_request_carries_text_controls_and_the_release_sampling(pre) -> None:
    out = run(pre, input="Hello.", voice="default", language="English", tokens=20, seed=3)
    assert out["message"]["text"] == "Hello." and out["message"]["tokens"] == 20
    assert out["ref_audio"] is None and out["max_frames"] == 50
    audio, text = out["sampling"], out["text_sampling"]
    assert (audio.temperature, audio.top_p, audio.top_k, audio.seed) == (1.7, 0.8, 25, 3)
    assert (text.temperature, text.top_k, text.top_p) == (1.5, 50, 1.0)
    assert audio.max_new_tokens > 50 + 32  # room for the drain and the first text step


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"input": "Hi", "voice": "alloy"}, "unknown voice 'alloy'"),
        ({"input": "   "}, "'input' is empty"),
        ({"input": "Hi", "speed": 1.5}, "does not change speed"),
        ({"input": "Hi", "tokens": 0}, "'tokens' must be in 1..50"),
        ({"input": "Hi", "max_frames": 51}, "'max_frames' must be in 1..50"),
        ({"input": "Hi", "ref_text": "words"}, "'ref_audio', which is missing"),
        ({"input": "Hi", "temperature": "hot"}, "'temperature' must be a number"),
        ({"input": "Hi", "text_top_p": 0}, "top_p must be in (0, 1]"),
        ({"input": "Hi", "bogus": 1}, "unknown field 'bogus'"),
        ({"input": "Hi <|im_start|>"}, "control token"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(pre, data, says) -> None:
    with pytest.raises(RequestError) as caught:
        run(pre, **data)
    assert says in str(caught.value)


def test_a_model_that_never_speaks_is_stopped_by_the_watchdog() -> None:
    torch.set_num_threads(1)
    model = MossTTSModel.from_pretrained("tiny", load_format="dummy", with_codec=False)
    cfg = model.config
    head = model.network.lm_heads[0].weight
    with torch.no_grad():  # no way into audio, and no way to end: text forever
        for token in (cfg.audio_start_token_id, cfg.im_end_token_id):
            head[token] = 0.0
            head[token, -1] = -10.0  # the dummy's steering dimension (loading._steer_dummy)
    rows, frames = model.generate(model.prompts.build("Hi.", max_frames=500), max_steps=1000)
    assert frames.shape[0] == 0
    assert rows.shape[0] == MAX_TEXT_STEPS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dummy_weights_at_the_release_depth_still_speak_to_the_cap(tmp_path, dtype) -> None:
    # The GPU check's MOSS-TTS 8B (36 layers) wrote text forever before the steering was
    # damped with depth: a random token of 151936 beat audio_start.
    torch.set_num_threads(1)
    shutil.copytree(PRESETS_DIR / "tiny", tmp_path / "deep")
    config = json.loads((tmp_path / "deep" / "config.json").read_text())
    config["language_config"].update(num_hidden_layers=36, hidden_size=128, head_dim=32)
    (tmp_path / "deep" / "config.json").write_text(json.dumps(config))
    model = MossTTSModel.from_pretrained(
        str(tmp_path / "deep"), load_format="dummy", with_codec=False, dtype=dtype
    )
    rows, frames = model.generate(model.prompts.build("Hello there.", max_frames=8), max_steps=60)
    cfg = model.config
    assert rows[0, 0].item() == cfg.audio_start_token_id
    assert frames.shape[0] == 8
    assert rows[-1, 0].item() == cfg.audio_end_token_id


def test_the_codec_is_found_by_setting_then_processor_config_then_default(tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    assert codec_reference(model) == (
        "OpenMOSS-Team/MOSS-Audio-Tokenizer",
        "the release's default codec",
    )
    (model / "processor_config.json").write_text(
        json.dumps({"audio_tokenizer_name_or_path": "x/y"})
    )
    assert codec_reference(model)[0] == "x/y"
    nested = {"audio_tokenizer": {"audio_tokenizer_name_or_path": "codec"}}
    (model / "processor_config.json").write_text(json.dumps(nested))
    assert codec_reference(model)[0] == "codec"
    assert codec_reference(model, "/elsewhere") == ("/elsewhere", "factory.codec_path")
    shutil.copytree(PRESETS_DIR / "tiny" / "codec", model / "codec")
    assert resolve_codec(model) == model / "codec"  # relative to the model directory
    with pytest.raises(FileNotFoundError, match=r"factory\.codec_path"):
        resolve_codec(model, "./nowhere", allow_download=False)


def _problems(model_path: str, **factory) -> list[str]:
    config = MossTTSPipeline(model_path=model_path)
    for stage in config.stages:
        for key, value in factory.get(stage.name, {}).get("factory", {}).items():
            setattr(stage.factory, key, value)
    return [message for _, message, _ in config.model_source_problems()]


def test_plan_time_refusals_name_the_stage_and_the_path(tmp_path: Path) -> None:
    # the preset has no weights: every loading stage must say dummy
    problems = _problems("tiny", tts_engine={"factory": {"load_format": "dummy"}})
    assert len(problems) == 1 and "stage 'vocoder' needs factory.load_format" in problems[0]
    # a checkpoint directory without weights, and a codec directory without them either
    root = tmp_path / "ckpt"
    shutil.copytree(PRESETS_DIR / "tiny", root)
    problems = _problems(str(root))
    assert any("no model.safetensors" in p and "'tts_engine'" in p for p in problems)
    assert any(p.startswith("codec directory") for p in problems)
    missing = {"factory": {"codec_path": "./missing"}}
    problems = _problems(
        str(root), tts_engine={"factory": {"load_format": "dummy"}}, vocoder=missing
    )
    assert any("codec './missing'" in p for p in problems)


def test_the_engine_estimate_counts_a_codec_of_its_own_only_when_not_shared() -> None:
    from omni_moss_tts.memory import CODEC_PARAMS, estimate

    shared = MossTTSPipeline()
    apart = MossTTSPipeline()
    apart.stage("vocoder").process = "vocoder"
    together = estimate(shared)["tts_engine"].weights_bytes
    alone = estimate(apart)["tts_engine"].weights_bytes
    assert alone - together == CODEC_PARAMS * 4  # float32
