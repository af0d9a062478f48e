"""The path language: what can be addressed, and what is refused with which fix."""

from __future__ import annotations

import pytest

from omni_core import EngineStageConfig, PipelineConfig, StageConfig, hookimpl
from omni_core.errors import ConfigError

from .conftest import SEED


@pytest.mark.parametrize(
    ("flag", "says", "fix"),
    [
        ("--stages.vocoder.gpu", "'stages.' prefix is implied", "--vocoder.gpu"),
        ("--vocoder", "names a whole stage", "--vocoder.<field>"),
        ("--tts_engine.engine", "names a whole group", "--tts_engine.engine.<field>"),
        ("--vocoder.factory", "names a whole group", "--vocoder.factory.<field>"),
        ("--processes.pipeline", "names a whole group", "--processes.pipeline.<field>"),
        ("--vocoder.gpu.0", "numeric index", "write the whole list"),
        ("--vocoder.next", "topology", "never rewire"),
        ("--vocoder.terminal", "topology", "never rewire"),
        ("--tts_engine.stream_to", "topology", "never rewire"),
        ("--vocoder.factory_path", "topology", "never rewire"),
        ("--vocoder.name", "topology", "never rewire"),
        ("--preprocessing.wait_for", "topology", "never rewire"),
        ("--preprocessing.merge_fn", "topology", "never rewire"),
        ("--preprocessing.route_fn", "topology", "never rewire"),
        ("--vocoder.factory.gpu_id", "owned by placement", "gpu_memory_fraction"),
        ("--vocoder.engine.max_running_requests", "not an engine stage", "tts_engine"),
        ("--vocoder.gpuu", "has no field 'gpuu'", "did you mean: gpu"),
        ("--processes.pipelin.num_replicas", "no stage runs in a process", "pipeline"),
        ("--placement.polcy", "has no field 'polcy'", "did you mean: policy"),
        ("--mps.x", "single value, not a group", "mps = VALUE"),
    ],
)
def test_refused_flags_say_what_to_write_instead(deploy, resolve, flag, says, fix):
    with pytest.raises(ConfigError) as info:
        resolve(deploy(SEED), flag, "1")
    message = str(info.value)
    assert says in message
    assert fix in message
    assert flag in message  # the origin


def test_topology_in_a_deploy_file_is_refused_with_its_line(deploy, resolve):
    path = deploy(
        """\
        pipeline = "qwen3-tts"
        [stages.vocoder]
        next = "preprocessing"
        """
    )
    with pytest.raises(ConfigError) as info:
        resolve(path)
    assert f"{path}:3" in str(info.value)
    assert "topology" in str(info.value)


def test_unknown_stage_in_a_deploy_file_lists_the_real_ones(deploy, resolve):
    path = deploy('pipeline = "qwen3-tts"\n[stages.vocodr.factory]\ndtype = "float16"\n')
    with pytest.raises(ConfigError) as info:
        resolve(path)
    message = str(info.value)
    assert f"{path}:2" in message  # the table header that names the stage
    assert "preprocessing, tts_engine, vocoder" in message
    assert "did you mean: vocoder" in message


def test_dashes_in_the_first_segment_read_as_underscores(resolve):
    hub_id = "Qwen/Qwen3-TTS-12Hz-1.7B-Base"
    res = resolve(None, "--model-path", hub_id, "--weight-share", "on", pipeline="qwen3-tts")
    assert res.config.model_path == hub_id
    assert res.config.weight_share == "on"


def test_top_level_groups_and_processes_by_flag(resolve):
    res = resolve(
        None,
        "--processes.pipeline.num_replicas",
        "2",
        "--processes.pipeline.replica_devices",
        "0,1",
        "--placement.policy",
        "auto",
        "--gpus",
        "2",
        "--gpu-memory",
        "80GiB",
        pipeline="qwen3-tts",
    )
    assert res.config.process_config("pipeline").num_replicas == 2
    assert res.config.process_config("pipeline").replica_devices == [0, 1]
    assert res.config.placement.policy == "auto"
    assert res.config.cluster.gpus == 2
    assert res.config.cluster.gpu_memory == 80 * 1024**3


def test_env_keys_are_free_form_strings(resolve):
    res = resolve(None, "--vocoder.env.OMP_NUM_THREADS", "4", pipeline="qwen3-tts")
    assert res.config.stage("vocoder").env == {"OMP_NUM_THREADS": "4"}


def _pipeline_with(stages, name="test-paths"):
    class Pipe(PipelineConfig):
        pipeline_name = name
        entry_stage = stages[0].name

        @classmethod
        def default_stages(cls):
            return [s.model_copy() for s in stages]

    return Pipe


def test_a_stage_named_like_a_top_level_field_cannot_be_a_flag(plugins, resolve):
    stages = [
        StageConfig(name="placement", factory_path="m:f", next="out", process="p"),
        StageConfig(name="out", factory_path="m:f", terminal=True, process="p"),
    ]

    class Plugin:
        @hookimpl
        def omni_register_pipelines(self):
            return [_pipeline_with(stages, "ambiguous")]

    with plugins.registered(Plugin(), "ambiguous-plugin"), pytest.raises(ConfigError) as info:
        resolve(None, "--placement.process", "q", pipeline="ambiguous")
    assert "both a stage" in str(info.value)
    assert "[stages.placement]" in str(info.value)


def test_broadcast_flag_is_refused_without_engine_stages(plugins, resolve):
    stages = [StageConfig(name="only", factory_path="m:f", terminal=True, process="p")]

    class Plugin:
        @hookimpl
        def omni_register_pipelines(self):
            return [_pipeline_with(stages, "no-engine")]

    with plugins.registered(Plugin(), "no-engine-plugin"), pytest.raises(ConfigError) as info:
        resolve(None, "--mem-fraction-static", "0.5", pipeline="no-engine")
    assert "no engine stage" in str(info.value)


def test_broadcast_reaches_every_engine_stage(resolve):
    res = resolve(None, "--mem-fraction-static", "0.4", pipeline="qwen3-omni")
    engines = [s for s in res.config.stages if isinstance(s, EngineStageConfig)]
    assert {s.name for s in engines} == {"thinker", "talker_ar"}
    assert all(s.engine.mem_fraction_static == 0.4 for s in engines)
