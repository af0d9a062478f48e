"""omni_core.kit.stages: the stage-side pieces every speech plugin's factories repeated."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import anyio
import pytest

from omni_core import RequestError
from omni_core.engine.interface import EngineSettings
from omni_core.kit.stages import (
    TTSPreprocessing,
    engine_settings,
    number,
    text,
    torch_device,
)


def test_a_stage_without_a_gpu_runs_on_the_cpu_and_a_missing_gpu_is_named():
    assert torch_device(None, "vocoder") == "cpu"
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        assert torch_device(0, "vocoder") == "cuda:0"
    else:
        with pytest.raises(RuntimeError, match="stage 'vocoder' was placed on GPU 3"):
            torch_device(3, "vocoder")


def test_the_placement_share_bounds_the_engine_unless_the_engine_group_says():
    assert engine_settings(None, 0.4).mem_fraction_static == 0.4
    assert engine_settings(None, None).mem_fraction_static is None
    written = EngineSettings(mem_fraction_static=0.7)
    assert engine_settings(written, 0.4).mem_fraction_static == 0.7


class Demo(TTSPreprocessing):
    pipeline = "demo-tts"
    request_keys = frozenset({"input", "instructions", "ref_text", "max_frames"})

    def load(self, model_path):
        self.threads: list[str] = []
        return str.split, 100

    def prepare(self, data):
        self.threads.append(threading.current_thread().name)
        return {"frames": number(data, "max_frames", self.max_frames, int)}


def run(stage: Demo, data: dict) -> dict:
    return anyio.run(stage.run, SimpleNamespace(data=data))


def test_a_tts_preprocessing_refuses_unknown_fields_and_long_texts_before_its_own_work():
    stage = Demo("tiny", max_input_tokens=4)
    assert stage.max_frames == 100 and Demo("tiny", max_frames=7).max_frames == 7
    assert run(stage, {"input": "a b c", "max_frames": 9}) == {"frames": 9}
    assert stage.threads and stage.threads[0] != threading.main_thread().name
    with pytest.raises(RequestError, match="unknown field 'speed' for demo-tts") as caught:
        run(stage, {"input": "x", "speed": 2})
    assert "accepted: input, instructions, max_frames, ref_text" in caught.value.hint
    with pytest.raises(RequestError, match=r"factory\.max_input_tokens"):
        run(stage, {"instructions": "one two three four five"})
    assert len(stage.threads) == 1  # neither refused request reached prepare


def test_request_fields_are_checked_by_type_and_name():
    assert number({"k": 2}, "k", 1, float) == 2.0 and number({}, "k", 1, int) == 1
    assert number({"k": None}, "k", 5, int) == 5
    for bad, says in ((True, "a number"), ("3", "a number"), (2.5, "an integer")):
        with pytest.raises(RequestError, match=f"'k' must be {says}"):
            number({"k": bad}, "k", 1, int)
    assert text({"t": "hi"}, "t") == "hi" and text({}, "t") is None
    with pytest.raises(RequestError, match="'t' must be a string, got int"):
        text({"t": 3}, "t")


def test_a_tensor_parallel_stage_outside_a_group_the_runtime_formed_is_refused():
    from omni_core.kit.stages import tp_group

    assert tp_group("thinker", 0, 1) is None
    with pytest.raises(RuntimeError, match="stage thinker has tp_size 2, but this process is not"):
        tp_group("thinker", 1, 2)


def test_every_tts_family_accepts_openais_speech_fields_and_the_servers_voices():
    from omni_core.kit.stages import SPEECH_REQUEST_KEYS

    openai = {"model", "input", "voice", "response_format", "speed", "instructions"}
    assert openai | {"stream_format", "voice_enroll", "voice_prompt"} <= SPEECH_REQUEST_KEYS
    assert "ref_audio" not in SPEECH_REQUEST_KEYS  # cloning fields are a family's own


def test_an_engine_factory_declares_the_standard_parameters_once_and_hands_a_context():
    import inspect

    from omni_core.errors import ConfigError
    from omni_core.factory import factory_kwargs
    from omni_core.kit.stages import ENGINE_PARAMETERS, EngineContext, engine_factory

    @engine_factory("talker")
    def create(engine: EngineContext, max_frames: int = 10) -> tuple:
        return engine, max_frames

    names = list(inspect.signature(create).parameters)
    assert names == [p.name for p in ENGINE_PARAMETERS] + ["max_frames"]
    # the core injects by these names and refuses a factory.* key the family does not take
    standard = {"model_path": "tiny", "gpu_id": None, "gpu_memory_fraction": 0.3, "tp_rank": 0}
    kwargs = factory_kwargs(
        create, stage_name="talker", factory_path="x:create", author={},
        config={"seed": 5, "max_frames": 7}, standard=standard,
    )  # fmt: skip
    assert "tp_rank" not in kwargs
    engine, frames = create(**kwargs)
    assert frames == 7 and engine.stage == "talker" and engine.device == "cpu"
    assert engine.settings.mem_fraction_static == 0.3
    assert engine.load_args == ("tiny", "auto", None, "cpu", 5)
    with pytest.raises(ConfigError, match=r"factory\.quantization is not a parameter of x:create"):
        factory_kwargs(
            create, stage_name="talker", factory_path="x:create", author={},
            config={"quantization": "int8"}, standard=standard,
        )  # fmt: skip
    with pytest.raises(TypeError, match="max_frame"):
        create("tiny", max_frame=3)  # a misspelt keyword is refused as for any function
    with pytest.raises(TypeError, match="need defaults"):
        engine_factory("talker")(lambda engine, path: None)
    with pytest.raises(TypeError, match="seed"):
        engine_factory("talker")(lambda engine, seed=1: None)
