"""The Qwen3-Omni pipelines.

``qwen3-omni`` (speech out, the default) runs one process per stage: the
encoders, the thinker and code2wav on GPU 0, the talker alone on GPU 1.
``qwen3-omni-colocated`` puts every GPU stage on GPU 0 and runs code2wav inside
the talker's process: on one card the GPU time-slices between processes, so
the vocoder decodes between talker steps instead of waiting for its own slice.
Its placement policy (``colocate``) requires every GPU stage to declare its
memory share, so the processes cannot grab memory first-come-first-served.
``qwen3-omni-text`` answers with text only: no talker, no vocoder, one process.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from omni_core import EngineStageConfig, FactoryArgs, PipelineConfig, StageConfig
from omni_core.kit.pipeline import SourceChecks, StreamingVocoderArgs, TypedWeightArgs
from omni_core.schema import DType, Quantization

from .plugin import CHECKPOINT_NAMES as ALIASES  # one list: the plugin registers them by name
from .source import SOURCE  # torch-free

STAGES = "omni_qwen3_omni.stages"
PREPROCESSING = "omni_qwen3_omni.preprocessing"
ROUTING = "omni_qwen3_omni.routing"
MODEL = "Qwen/Qwen3-Omni-30B-A3B-Instruct"


class PreprocessingArgs(FactoryArgs):
    # per request: media count and size bounds, checked before anything is decoded
    max_images: int = Field(default=16, ge=0)
    max_audios: int = Field(default=8, ge=0)
    max_audio_seconds: float = Field(default=300.0, gt=0)
    max_media_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    max_image_pixels: int = Field(default=8192 * 8192, ge=1)  # one image, from its header
    max_request_pixels: int = Field(default=2 * 8192 * 8192, ge=1)  # all images of a request
    max_request_audio_seconds: float = Field(default=600.0, gt=0)  # all clips of a request
    # video parts, each priced from its header before a frame is decoded (a sound track
    # used as audio in video counts as a clip: max_audio_seconds and the request's total)
    max_videos: int = Field(default=2, ge=0)
    max_video_seconds: float = Field(default=600.0, gt=0)  # one video's declared duration
    max_video_frames: int = Field(default=36_000, ge=1)  # frames one video declares
    max_video_pixels: int = Field(default=4096 * 2160, ge=1)  # one frame: 4K; 8K is refused
    # the prompt's tokens (text and media placeholders), estimated from the text and
    # the media's headers before anything is decoded; the thinker's engine checks the
    # exact count against a cache slot's length (a longer prompt than a step's
    # engine.max_prefill_tokens is prefilled in chunks)
    max_prompt_tokens: int = Field(default=8192, ge=1)
    # the largest max_tokens a request may ask for (also its default)
    max_tokens: int = Field(default=2048, ge=1)


class EngineFactoryArgs(TypedWeightArgs):
    """A stage holding part of the checkpoint (dtype auto: its bf16 where the device is fast)."""


class DecoderArgs(EngineFactoryArgs):
    # int8: the decoder's large linear layers as int8 weights (needs dtype bfloat16)
    quantization: Quantization = "none"
    # CPU, bf16: a float16 copy of each blocked linear weight for fbgemm's kernel, which
    # reads one or two rows 1.2-1.6x faster; the linear layers' memory twice over
    # (omni_core.engine.cpu_row_copy)
    fp16_row_weights: bool = False


class EncoderArgs(EngineFactoryArgs):
    # requests encoded in one tower call: those that arrive while a call runs join the
    # next one (omni_core/kit/batching.py); a lone request never waits
    max_batch_size: int = Field(default=8, ge=1)


class TalkerArgs(DecoderArgs):
    # frames a spoken answer may take (12.5 per second: 2048 is 164 s)
    max_frames: int = Field(default=2048, ge=1)


class Code2WavArgs(StreamingVocoderArgs):
    # Each frame is 80 ms. Streaming is stateful: every frame is decoded once and
    # the stream equals a full decode (the release re-decodes 25 frames of left
    # context per chunk instead; left_context_frames = 25 does that).
    dtype: DType = "float32"
    # CPU, float32 decoder: every linear layer on the faster kernel for a chunk's row count
    # (as Qwen3-TTS's vocoder; omni_qwen3_tts.stages.route_float32_layers)
    pack_weights: bool = True
    # GPU: the streamed chunks run eagerly instead of as CUDA graphs (one per rows bucket and
    # chunk length, checked against eager at capture; omni_qwen3_tts.speech_tokenizer.stream_graphs)
    disable_cuda_graph: bool = False


def _front(fan_in: str, route_fn: str, process: dict[str, str]) -> list[StageConfig]:
    """preprocessing and the two encoders, feeding ``fan_in``."""
    return [
        StageConfig(
            name="preprocessing",
            factory_path=f"{PREPROCESSING}:create_preprocessing",
            next=["image_encoder", "audio_encoder", fan_in],
            route_fn=f"{ROUTING}:{route_fn}",
            process=process["preprocessing"],
            factory=PreprocessingArgs(),
        ),
        StageConfig(
            name="image_encoder",
            factory_path=f"{STAGES}:create_image_encoder",
            next=fan_in,
            process=process["image_encoder"],
            gpu=0,
            factory=EncoderArgs(),
        ),
        StageConfig(
            name="audio_encoder",
            factory_path=f"{STAGES}:create_audio_encoder",
            next=fan_in,
            process=process["audio_encoder"],
            gpu=0,
            factory=EncoderArgs(),
        ),
    ]


def _speech_stages(*, talker_gpu: int, processes: dict[str, str]):
    return [
        *_front("thinker", "route_to_thinker", processes),
        EngineStageConfig(
            name="thinker",
            factory_path=f"{STAGES}:create_thinker",
            engine_backends=["torch", "sglang"],
            wait_for=["preprocessing", "image_encoder", "audio_encoder"],
            merge_fn=f"{ROUTING}:merge_encoder_outputs",
            next=["decode", "talker_ar"],
            stream_to=["talker_ar", "decode"],
            process=processes["thinker"],
            gpu=0,
            factory=DecoderArgs(),
            author_kwargs={"talker_stage": "talker_ar"},
        ),
        StageConfig(
            name="decode",
            factory_path=f"{STAGES}:create_decode",
            terminal=True,
            process=processes["decode"],
        ),
        EngineStageConfig(
            name="talker_ar",
            factory_path=f"{STAGES}:create_talker",
            next="code2wav",
            stream_to=["code2wav"],
            process=processes["talker_ar"],
            gpu=talker_gpu,
            factory=TalkerArgs(),
        ),
        StageConfig(
            name="code2wav",
            factory_path=f"{STAGES}:create_code2wav",
            terminal=True,
            process=processes["code2wav"],
            gpu=0,
            gpu_memory_fraction=0.02,
            factory=Code2WavArgs(),
        ),
    ]


SPEECH_PROCESSES = {
    name: name
    for name in (
        "preprocessing",
        "image_encoder",
        "audio_encoder",
        "thinker",
        "decode",
        "talker_ar",
        "code2wav",
    )
}
COLOCATED_PROCESSES = {**SPEECH_PROCESSES, "code2wav": "talker_ar"}


class _Qwen3OmniSource(SourceChecks):
    """The kit's model-path checks at resolve time (torch-free), and the talker's voices."""

    model_source: ClassVar = SOURCE
    # The thinker splits over tp_size ranks (thinker/tensor_parallel.py says how)
    tensor_parallel_stages: ClassVar[tuple[str, ...]] = ("thinker",)

    def tensor_parallel_sizes(self, stage: str) -> dict[str, int]:
        """What the thinker's split divides, from a local ``config.json`` (else unknown)."""
        config = SOURCE.local_config(self.model_path)  # type: ignore[attr-defined]
        if stage != "thinker" or not isinstance(config, dict):
            return {}
        from .config import ThinkerConfig
        from .thinker.sizes import split_sizes

        try:
            return split_sizes(ThinkerConfig.from_dict(config).text)
        except Exception:  # a config the model-source checks refuse, saying why
            return {}

    def builtin_voices(self) -> list[str] | None:
        """The talker's speakers (``talker_config.speaker_id``), read from a local config."""
        config = SOURCE.local_config(self.model_path)  # type: ignore[attr-defined]
        if config is None:
            return None
        speakers = (config.get("talker_config") or {}).get("speaker_id") or {}
        return sorted(str(name).lower() for name in speakers)


class Qwen3OmniSpeechPipeline(_Qwen3OmniSource, PipelineConfig):
    pipeline_name: ClassVar[str] = "qwen3-omni"
    aliases: ClassVar[tuple[str, ...]] = (*ALIASES, "Qwen3OmniSpeechPipelineConfig")
    description: ClassVar[str] = (
        "Qwen3-Omni: audio/image/text in, text and speech out; one process per stage, two GPUs"
    )
    entry_stage: ClassVar[str] = "preprocessing"
    default_model_path: ClassVar[str] = MODEL
    api: ClassVar[tuple[str, ...]] = ("chat", "speech", "transcription")
    text_stage: ClassVar[str | None] = "decode"
    audio_stage: ClassVar[str | None] = "code2wav"
    sample_rate: ClassVar[int | None] = 24000
    # /v1/audio/speech's input is the user's turn: the model answers it aloud (preprocessing)
    speech_input: ClassVar[Literal["read", "answer"]] = "answer"

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return _speech_stages(talker_gpu=1, processes=SPEECH_PROCESSES)


class Qwen3OmniColocatedPipeline(_Qwen3OmniSource, PipelineConfig):
    pipeline_name: ClassVar[str] = "qwen3-omni-colocated"
    aliases: ClassVar[tuple[str, ...]] = ("Qwen3OmniSpeechColocatedPipelineConfig",)
    description: ClassVar[str] = (
        "Qwen3-Omni speech on one GPU; code2wav runs in the talker's process; "
        "every GPU stage must declare its memory share"
    )
    entry_stage: ClassVar[str] = "preprocessing"
    default_model_path: ClassVar[str] = MODEL
    api: ClassVar[tuple[str, ...]] = ("chat", "speech", "transcription")
    text_stage: ClassVar[str | None] = "decode"
    audio_stage: ClassVar[str | None] = "code2wav"
    sample_rate: ClassVar[int | None] = 24000
    # /v1/audio/speech's input is the user's turn: the model answers it aloud (preprocessing)
    speech_input: ClassVar[Literal["read", "answer"]] = "answer"
    default_placement_policy: ClassVar[str] = "colocate"

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        stages = _speech_stages(talker_gpu=0, processes=COLOCATED_PROCESSES)
        for stage in stages:
            if stage.name == "code2wav":
                # The share comes from the deploy file, like every other stage's.
                stage.gpu_memory_fraction = None
        return stages


class Qwen3OmniTextPipeline(_Qwen3OmniSource, PipelineConfig):
    pipeline_name: ClassVar[str] = "qwen3-omni-text"
    aliases: ClassVar[tuple[str, ...]] = ("Qwen3OmniTextPipelineConfig",)
    description: ClassVar[str] = (
        "Qwen3-Omni thinker only: audio/image/text in, text out; one process on one GPU"
    )
    entry_stage: ClassVar[str] = "preprocessing"
    default_model_path: ClassVar[str] = MODEL
    api: ClassVar[tuple[str, ...]] = ("chat", "transcription")
    text_stage: ClassVar[str | None] = "decode"

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        one = dict.fromkeys(("preprocessing", "image_encoder", "audio_encoder"), "pipeline")
        return [
            *_front("mm_aggregate", "route_to_aggregate", one),
            StageConfig(
                name="mm_aggregate",
                factory_path=f"{STAGES}:create_mm_aggregate",
                wait_for=["preprocessing", "image_encoder", "audio_encoder"],
                merge_fn=f"{ROUTING}:merge_encoder_outputs",
                next="thinker",
                process="pipeline",
                gpu=0,
            ),
            EngineStageConfig(
                name="thinker",
                factory_path=f"{STAGES}:create_thinker",
                engine_backends=["torch", "sglang"],
                next="decode",
                stream_to=["decode"],
                process="pipeline",
                gpu=0,
                factory=DecoderArgs(),
            ),
            StageConfig(
                name="decode",
                factory_path=f"{STAGES}:create_decode",
                terminal=True,
                process="pipeline",
            ),
        ]
