"""The qwen3-asr pipeline: registration, strict loading, and requests through real processes."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import save_file  # noqa: E402

import omni_qwen3_asr.plugin as asr_plugin  # noqa: E402
from omni_core import RequestError  # noqa: E402
from omni_core.kit.weights import CheckpointError  # noqa: E402
from omni_core.testing import plan_on_cpu  # noqa: E402
from omni_qwen3_asr.loading import load_model  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_asr_demo.toml"


def _request(wav: bytes, **transcription) -> dict:
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode()}}
    return {
        "messages": [{"role": "user", "content": [audio]}],
        "sampling": {"max_tokens": 12, "temperature": 0.0},
        "transcription": {"task": "transcribe", **transcription},
    }


def test_the_plugin_lists_its_pipeline_with_a_memory_estimate(plugins) -> None:
    with plugins.registered(asr_plugin, "omni_qwen3_asr.plugin") as name:
        (row,) = [r for r in plugins.listing() if r["name"] == name]
    assert row["error"] is None and row["pipelines"] == ["qwen3-asr"]
    assert "omni_estimate_memory" in row["hooks"]


def test_the_memory_estimate_sizes_both_towers_and_the_kv_cache(plugins, short_tmp) -> None:
    from omni_qwen3_asr.memory import estimate

    planned = plan_on_cpu(plugins, short_tmp, deploy=DEMO.with_name("qwen3_asr.toml"))
    (stage,) = estimate(planned.config)
    got = estimate(planned.config)[stage]
    assert stage == "asr"
    # Qwen3-ASR-1.7B in bfloat16: ~1.7 G parameters at 2 bytes (tower + decoder + head)
    assert 3.0e9 < got.weights_bytes < 5.0e9
    assert got.kv_bytes > 0 and "Qwen3-ASR-1.7B" in got.source
    # the seed's settings of its single asr stage, each where its reader finds it
    asr = {stage.name: stage for stage in planned.config.stages}["asr"]
    assert asr.factory.dtype == "bfloat16"
    engine = asr.engine
    assert (engine.max_running_requests, engine.cuda_graph_max_bs) == (32, 32)
    assert engine.mem_fraction_static == 0.8 and engine.enable_torch_compile is True


def _release_checkpoint(directory: Path, seed: int = 3) -> dict[str, torch.Tensor]:
    """The tiny model's tensors under the release's names, as save_pretrained writes them."""
    model = load_model("tiny", "dummy", "float32", "cpu", seed)
    tensors = {f"thinker.audio_tower.{k}": v for k, v in model.encoder.state_dict().items()}
    tensors |= {f"thinker.{k}": v for k, v in model.lm.state_dict().items()}
    directory.mkdir()
    for name in ("config.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        (directory / name).write_bytes((model.root / name).read_bytes())
    (directory / "chat_template.json").write_bytes((model.root / "chat_template.json").read_bytes())
    return {k: v.clone().contiguous() for k, v in tensors.items()}


def test_a_checkpoint_loads_strictly_by_prefix(tmp_path) -> None:
    good = tmp_path / "good"
    tensors = _release_checkpoint(good)
    save_file(tensors, str(good / "model.safetensors"))
    loaded = load_model(str(good), "auto", "float32", "cpu")
    for key, value in loaded.encoder.state_dict().items():
        assert torch.equal(value, tensors[f"thinker.audio_tower.{key}"]), key
    assert torch.equal(loaded.lm.lm_head.weight, tensors["thinker.lm_head.weight"])

    extra = tmp_path / "extra"
    _release_checkpoint(extra)
    save_file(
        {**tensors, "thinker.visual.patch.weight": torch.zeros(2)}, str(extra / "model.safetensors")
    )
    with pytest.raises(CheckpointError, match=r"does not have: thinker.visual.patch.weight"):
        load_model(str(extra), "auto", "float32", "cpu")

    short = tmp_path / "short"
    _release_checkpoint(short)
    del tensors["thinker.model.norm.weight"]
    save_file(tensors, str(short / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) thinker.model.norm.weight"):
        load_model(str(short), "auto", "float32", "cpu")


def test_a_spoken_clip_runs_through_every_stage(plugins, short_tmp, hello_wav) -> None:
    import anyio

    planned = plan_on_cpu(plugins, short_tmp, deploy=DEMO)
    asked = [{}, {"language": "de", "prompt": "Grafana"}, {"timestamps": ["word"]}]

    async def through_one_runtime() -> list[dict]:
        async with planned.runtime() as runtime:
            return [(await runtime.run(_request(hello_wav, **a)))["align"] for a in asked]

    detected, forced, timed = anyio.run(through_one_runtime)
    for out in (detected, forced, timed):
        assert out["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 12
    assert forced["language"] == "German"
    assert "words" not in detected and timed["words"]  # the demo loads the tiny aligner
    assert {"word", "start", "end"} == set(timed["words"][0])
    # the context and the forced header lengthen the prompt by their tokens
    assert forced["usage"]["prompt_tokens"] > detected["usage"]["prompt_tokens"]


@pytest.mark.slow  # three deployments start: about a minute on two cores
def test_two_replicas_share_one_copy_of_the_weights(plugins, short_tmp, hello_wav) -> None:
    flags = ["--processes.pipeline.num_replicas", "2", "--weight_share", "on"]
    shared = plan_on_cpu(plugins, short_tmp, deploy=DEMO, flags=flags)
    (group,) = shared.plan.weight_share.groups
    assert len(group.followers) == 1
    alone = plan_on_cpu(plugins, short_tmp, deploy=DEMO).run(_request(hello_wav))["align"]
    import anyio

    async def together() -> list[dict]:
        replies: list[dict] = []
        async with shared.runtime() as runtime:

            async def one() -> None:
                replies.append((await runtime.run(_request(hello_wav)))["align"])

            async with anyio.create_task_group() as tg:
                for _ in range(4):  # concurrent: both replicas take some
                    tg.start_soon(one)
        return replies

    replies = anyio.run(together)
    assert alone["text"] and [r["text"] for r in replies] == [alone["text"]] * 4


def test_bad_requests_are_refused_naming_the_field(plugins, short_tmp, hello_wav) -> None:
    from omni_qwen3_asr.preprocessing import create_preprocessing

    stage = create_preprocessing("tiny", max_tokens=16)

    class Request:
        def __init__(self, data):
            self.data = data

    import anyio

    def refused(data) -> str:
        with pytest.raises(RequestError) as caught:
            anyio.run(stage.run, Request(data))
        return str(caught.value)

    assert "Klingon" in refused(_request(hello_wav, language="Klingon"))
    assert "no input_audio part" in refused({"messages": [{"role": "user", "content": "hi"}]})
    assert "at most 16" in refused({**_request(hello_wav), "sampling": {"max_tokens": 17}})
    garbage = _request(b"not audio at all")
    assert "messages.0.content.0.input_audio.data" in refused(garbage)


class _Streamed:
    def __init__(self, items: list):
        self.items, self.emitted = items, []

    @property
    async def stream(self):
        for item in self.items:
            yield item

    async def emit(self, item) -> None:
        self.emitted.append(item)


def test_word_timings_without_an_aligner_are_refused_naming_the_setting() -> None:
    import anyio

    from omni_qwen3_asr.stages import create_align

    trailer = {"finish_reason": "stop", "usage": None, "language": None}
    stage = create_align("tiny")  # no aligner_path
    plain = _Streamed(["hi", " there", {**trailer, "align": None}])
    assert anyio.run(stage.run, plain)["finish_reason"] == "stop"
    assert plain.emitted == ["hi", " there"]  # the text passes on as it streams
    asked = _Streamed(["hi", {**trailer, "align": torch.zeros(128, 50)}])
    with pytest.raises(RequestError) as refused:
        anyio.run(stage.run, asked)
    assert "stages.align.factory.aligner_path" in refused.value.render()


def test_an_aligner_and_an_asr_checkpoint_are_not_confused() -> None:
    from omni_qwen3_asr.loading import load_aligner

    with pytest.raises(ValueError, match=r"goes in stages\.align\.factory\.aligner_path"):
        load_model("tiny-aligner", "dummy", "float32", "cpu")
    with pytest.raises(ValueError, match="is not a Qwen3-ForcedAligner checkpoint"):
        load_aligner("tiny", "dummy", "float32", "cpu")


def test_the_aligner_path_is_checked_before_any_process_starts(plugins, short_tmp) -> None:
    from omni_core.errors import ConfigError

    with pytest.raises(ConfigError) as missing:
        plan_on_cpu(
            plugins, short_tmp, deploy=DEMO, flags=["--align.factory.aligner_path", "/no/dir"]
        )
    assert (
        "stages.align.factory.aligner_path '/no/dir' is neither a directory"
        in missing.value.render()
    )
    assert "Qwen/Qwen3-ForcedAligner-0.6B" in missing.value.render()
    flags = ["--align.factory.aligner_load_format", "auto"]
    with pytest.raises(ConfigError) as preset:
        plan_on_cpu(plugins, short_tmp, deploy=DEMO, flags=flags)
    assert 'needs factory.aligner_load_format = "dummy"' in preset.value.render()


def test_concurrent_clips_share_tower_calls_and_get_their_own_rows() -> None:
    """factory.encoder_max_batch_size: clips arriving while the tower runs join its next call."""
    import anyio
    import numpy as np

    from omni_qwen3_asr.stages import ASR
    from omni_qwen3_omni.audio.mel import audio_token_count

    model = load_model("tiny", "dummy", "float32", "cpu", 0)
    asr = ASR(engine=None, encoder=model.encoder, device="cpu", encoder_max_batch_size=2)
    rng = np.random.default_rng(0)
    mels = [
        torch.from_numpy(rng.standard_normal((128, frames)).astype(np.float32))
        for frames in (150, 370, 60, 1031)
    ]
    audio_id = 7
    ids = [[1, *[audio_id] * audio_token_count(int(m.shape[-1])), 2] for m in mels]
    prompts: dict[int, object] = {}

    async def one(i: int) -> None:
        (prompts[i],) = await asr._prompts([ids[i]], [mels[i]], audio_id)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(len(mels)):
                tg.start_soon(one, i)

    anyio.run(main)
    assert asr.coalescer.batch_sizes == [1, 2, 1]  # the first alone, then by twos
    for i, mel in enumerate(mels):
        torch.testing.assert_close(prompts[i].embeddings, asr._encode(mel), atol=1e-5, rtol=1e-5)
        assert prompts[i].embedding_index.tolist() == list(range(1, len(ids[i]) - 1))
