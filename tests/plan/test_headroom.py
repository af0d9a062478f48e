"""The plan warns when what the memory shares leave of a GPU cannot hold what they do not
cover: the engines' activations and graphs, and the stages that declare no share."""

from __future__ import annotations

from omni_core import EngineArgs
from omni_core.plan import GpuInventory, plan_deployment
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

GiB = 1024**3


def _warnings(plan) -> list[str]:
    return [n for n in plan.notes if "may run out of memory under load" in n]


def test_a_small_gpu_beside_an_engine_share_is_warned_of(plugins, configure):
    config = configure(
        Qwen3TTSPipeline, {"tts_engine": {"engine": EngineArgs(mem_fraction_static=0.6)}}
    )
    small = plan_deployment(config, GpuInventory.uniform(1, 6 * GiB), plugins=plugins)
    (warning,) = _warnings(small)
    assert "GPU 0" in warning and "leave 2.4GiB" in warning
    # the engine's activations and graphs, the whole vocoder (weights, chunks, graphs)
    assert "tts_engine 1GiB" in warning and "vocoder 2.91GiB" in warning
    assert "max_batch_size" in warning  # what to change
    roomy = plan_deployment(config, GpuInventory.uniform(1, 24 * GiB), plugins=plugins)
    assert _warnings(roomy) == []


def test_a_declared_share_covers_its_stage(plugins, configure):
    config = configure(
        Qwen3TTSPipeline,
        {
            "tts_engine": {"engine": EngineArgs(mem_fraction_static=0.6)},
            "vocoder": {"gpu_memory_fraction": 0.35},
        },
    )
    plan = plan_deployment(config, GpuInventory.uniform(1, 6 * GiB), plugins=plugins)
    (warning,) = _warnings(plan)  # 5 % of 6 GiB left: the engine's 1 GiB does not fit
    needs = warning.split("beside them (")[1].split(":")[0]
    assert needs == "tts_engine 1GiB"


def test_unknown_memory_and_a_smaller_vocoder_say_nothing(plugins, configure):
    config = configure(
        Qwen3TTSPipeline, {"tts_engine": {"engine": EngineArgs(mem_fraction_static=0.6)}}
    )
    unknown = plan_deployment(config, GpuInventory.uniform(1, None), plugins=plugins)
    assert _warnings(unknown) == []
    factory = (
        Qwen3TTSPipeline()
        .stage("vocoder")
        .factory.model_copy(update={"max_batch_size": 2, "disable_cuda_graph": True})
    )
    smaller = configure(
        Qwen3TTSPipeline,
        {
            "tts_engine": {"engine": EngineArgs(mem_fraction_static=0.6)},
            "vocoder": {"factory": factory},
        },
    )
    eight = GpuInventory.uniform(1, 8 * GiB)  # 3.2 GiB left: 3.91 needed by default
    assert _warnings(plan_deployment(config, eight, plugins=plugins))
    assert _warnings(plan_deployment(smaller, eight, plugins=plugins)) == []


def test_streams_follow_the_requests_the_plan_sized(plugins, configure):
    """A vocoder keeps a stream for each request its engine runs: where the plan sizes
    the engine's unwritten max_running_requests from memory, the vocoder's estimate and
    the warning count that many streams, not the backend's default."""
    from omni_qwen3_omni.pipeline import Qwen3OmniSpeechPipeline

    share = 0.5  # of an 80 GiB GPU: room for far more full-length talker requests than 8
    config = configure(
        Qwen3OmniSpeechPipeline, {"talker_ar": {"engine": EngineArgs(mem_fraction_static=share)}}
    )
    written = configure(
        Qwen3OmniSpeechPipeline,
        {"talker_ar": {"engine": EngineArgs(mem_fraction_static=share, max_running_requests=8)}},
    )
    inventory = GpuInventory.uniform(8, 80 * GiB)
    sized = plan_deployment(config, inventory, plugins=plugins, policy="auto")
    fixed = plan_deployment(written, inventory, plugins=plugins, policy="auto")
    streams = sized.running_requests["talker_ar"]
    assert streams > 16 and "talker_ar" not in fixed.running_requests
    assert f"{streams} streams' state" in sized.estimates["code2wav"].source
    assert "16 streams' state" in fixed.estimates["code2wav"].source  # a batch at least
    grown = sized.estimates["code2wav"].overhead_bytes - fixed.estimates["code2wav"].overhead_bytes
    assert grown > 0
    # the config the user resolved is left as written
    assert "max_running_requests" not in config.stage("talker_ar").engine.model_fields_set


def test_the_warning_counts_the_sized_requests_streams_under_a_declared_placement(
    plugins, configure
):
    """The declared policy asks the plugins only for the warning: there too the vocoder's
    need counts a stream for each request the plan sized (MOSS-TTS's up to 170 MB each)."""
    from omni_moss_tts.pipeline import MossTTSPipeline

    def planned(**engine):
        args = EngineArgs(mem_fraction_static=0.95, **engine)
        config = configure(MossTTSPipeline, {"tts_engine": {"engine": args}})
        return plan_deployment(config, GpuInventory.uniform(1, 141 * GiB), plugins=plugins)

    def vocoder_need(plan) -> str:
        (warning,) = _warnings(plan)  # 5 % of the GPU left: the codec alone needs more
        return warning.split("vocoder ")[1].split(":")[0].split(",")[0]

    sized = planned()
    requests = sized.running_requests["tts_engine"]
    assert requests > 16  # more than a batch: the streams beyond it are what this is about
    assert vocoder_need(sized) == vocoder_need(planned(max_running_requests=requests))
    assert vocoder_need(sized) != vocoder_need(planned(max_running_requests=16))
