"""Which stages may run tensor-parallel, refused or planned before any process starts.

The shipped plugins declare their splittable stages (the Qwen3-Omni thinker,
the MOSS-TTS backbone); ``omni plan`` refuses every other stage with
``tp_size > 1``, and a ``tp_size`` the model's heads cannot divide, with the
numbers, the origin of the value and exit status 2. On the SGLang backend
the ranks are SGLang's: the plan shows one omni process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_core import EngineStageConfig, PipelineConfig, StageConfig
from omni_core.cli import main
from omni_core.errors import ConfigError
from omni_core.plan import plan_deployment

EXAMPLES = Path(__file__).parents[2] / "examples"
TEXT_DEMO = str(EXAMPLES / "qwen3_omni_text_demo.toml")
MOSS_DEMO = str(EXAMPLES / "moss_tts_demo.toml")


@pytest.fixture(autouse=True)
def _fresh_plugins(plugins):
    """The CLI uses the process-wide manager; the fixture resets it around each test."""
    yield


def _tp(stage: str, size: int) -> list[str]:
    gpus = json.dumps(list(range(size)))
    return [f"--{stage}.tp_size", str(size), f"--{stage}.gpu", gpus, f"--{stage}.process", stage]


def test_the_thinker_at_tp_2_is_two_rank_processes(capsys):
    assert main(["plan", TEXT_DEMO, "--json", *_tp("thinker", 2)]) == 0
    plan = json.loads(capsys.readouterr().out)
    ranks = [p for p in plan["processes"] if p["stages"] == ["thinker"]]
    assert [(p["name"], p["tp_rank"], p["tp_size"], p["leader"]) for p in ranks] == [
        ("thinker_tp0", 0, 2, True),
        ("thinker_tp1", 1, 2, False),
    ]
    assert all(p["engine_ranks"] == 0 for p in ranks)


def test_a_tp_size_that_does_not_divide_the_heads_is_refused_with_the_numbers(capsys):
    assert main(["plan", TEXT_DEMO, *_tp("thinker", 3)]) == 2
    err = capsys.readouterr().err
    assert "stage 'thinker': tp_size 3 does not divide the model's attention heads (4)" in err
    assert "KV heads (2)" in err
    assert "(set by --thinker.tp_size)" in err
    assert "use a tp_size that divides 4, 2, 32: 1, 2" in err


def test_the_moss_backbone_splits_and_its_vocoder_does_not(capsys):
    assert main(["plan", MOSS_DEMO, "--json", *_tp("tts_engine", 2)]) == 0
    names = [p["name"] for p in json.loads(capsys.readouterr().out)["processes"]]
    assert names == ["pipeline", "tts_engine_tp0", "tts_engine_tp1"]
    assert main(["plan", MOSS_DEMO, *_tp("vocoder", 2)]) == 2
    err = capsys.readouterr().err
    assert "stage 'vocoder' has tp_size 2, but its factory does not split its weights" in err
    assert "tensor parallelism is implemented for stage tts_engine" in err
    assert "(set by --vocoder.tp_size)" in err
    assert main(["plan", MOSS_DEMO, *_tp("tts_engine", 4)]) == 2
    assert "tp_size 4 does not divide the model's KV heads (2)" in capsys.readouterr().err


def test_a_deploy_file_line_is_named_as_the_origin(tmp_path, capsys):
    deploy = tmp_path / "tp.toml"
    extra = '\n[stages.audio_encoder]\ntp_size = 2\ngpu = [0, 1]\nprocess = "enc"\n'
    deploy.write_text(Path(TEXT_DEMO).read_text() + extra)
    assert main(["plan", str(deploy)]) == 2
    err = capsys.readouterr().err
    assert "stage 'audio_encoder' has tp_size 2" in err
    assert f"set by {deploy}:" in err


def test_on_sglang_the_ranks_are_the_engines_in_one_omni_process(capsys):
    flags = [*_tp("thinker", 2), "--thinker.engine.backend", "sglang"]
    real = str(EXAMPLES / "qwen3_omni_text.toml")
    assert main(["plan", real, "--gpus", "2", "--gpu-memory", "80GiB", *flags]) == 0
    out = capsys.readouterr().out
    assert "2 in SGLang" in out
    assert "thinker is one omni process; its SGLang engine starts 2 scheduler ranks" in out
    assert main(["plan", real, "--json", "--gpus", "2", "--gpu-memory", "80GiB", *flags]) == 0
    plan = json.loads(capsys.readouterr().out)
    (thinker,) = [p for p in plan["processes"] if p["stages"] == ["thinker"]]
    assert (thinker["name"], thinker["tp_rank"], thinker["engine_ranks"]) == ("thinker", None, 2)
    assert thinker["gpu"] == 0
    assert plan["gpus"]["1"]["stages"] == ["thinker"]  # its second rank's GPU is counted
    gaps = [*flags[:2], "--thinker.gpu", "[0, 2]", *flags[4:]]
    assert main(["plan", real, "--gpus", "3", "--gpu-memory", "80GiB", *gaps]) == 2
    assert "but the stage is placed on GPUs [0, 2]" in capsys.readouterr().err


class _NoTP(PipelineConfig):
    pipeline_name = "test-no-tp"
    entry_stage = "a"

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [
            EngineStageConfig(name="a", factory_path="x:y", terminal=True, tp_size=2, gpu=[0, 1])
        ]


def test_a_pipeline_that_declares_no_split_refuses_every_tp_stage():
    with pytest.raises(ConfigError) as caught:
        plan_deployment(_NoTP(), policy="cpu")
    message = caught.value.render()
    assert "stage 'a' has tp_size 2" in message
    assert "implemented for no stage of pipeline 'test-no-tp'" in message


def test_compiled_steps_are_refused_with_tensor_parallelism(capsys):
    flags = [*_tp("tts_engine", 2), "--tts_engine.engine.enable_torch_compile", "true"]
    assert main(["plan", MOSS_DEMO, *flags]) == 2
    err = capsys.readouterr().err
    assert "engine.enable_torch_compile with tp_size 2 is not implemented yet" in err
    assert "--tts_engine.engine.enable_torch_compile" in err
