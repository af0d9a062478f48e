"""The Qwen3-TTS pipeline: preprocessing -> tts_engine (streams) -> vocoder.

All three stages share the process ``pipeline`` by default: the model is small,
so payloads pass between stages as Python objects and one GPU holds the talker,
its code predictor and the speech-tokenizer decoder.
"""

from __future__ import annotations

from typing import ClassVar

from omni_core import EngineStageConfig, FactoryArgs, PipelineConfig, StageConfig

PACKAGE = "omni_qwen3_tts.stages"


class PreprocessingArgs(FactoryArgs):
    max_ref_audio_seconds: float = 30.0
    max_frames: int | None = None  # per-request cap; default: generation_config max_new_tokens


class EngineFactoryArgs(FactoryArgs):
    dtype: str | None = None  # default: bfloat16 on CUDA, float32 on CPU
    load_format: str = "auto"  # auto | safetensors | dummy (seeded random weights)
    seed: int = 0  # of dummy weights
    # CPU only: repack the talker's large float32 linear weights for oneDNN, which
    # streams them ~1.7x faster than MKL at decoding batch sizes (omni_core.engine.cpu_linear)
    pack_weights: bool = True


class VocoderArgs(FactoryArgs):
    dtype: str | None = None
    load_format: str = "auto"
    seed: int = 0
    max_batch_size: int | None = None  # chunks decoded together (default: 16 GPU, 1 CPU)
    # frames in the first audio chunk (4 frames = 0.32 s of audio): stateful decoding
    # re-decodes nothing, so a short first chunk costs ~5% more codec work in all and
    # brings the first audio 8 frames earlier than the release's 12
    chunk_frames: int = 4
    max_chunk_frames: int | None = 48  # later chunks double up to this (none: all equal)
    # none: stateful streaming, each frame decoded once, equal to a full decode;
    # a number: re-decode that many frames before every chunk (the release uses 25)
    left_context_frames: int | None = None


class Qwen3TTSPipeline(PipelineConfig):
    pipeline_name: ClassVar[str] = "qwen3-tts"
    aliases: ClassVar[tuple[str, ...]] = (
        "qwen3_tts",
        "Qwen3TTSForConditionalGeneration",
        "Qwen3TTSPipelineConfig",
    )
    description: ClassVar[str] = (
        "Qwen3-TTS 12 Hz (Base / CustomVoice / VoiceDesign): text to 24 kHz speech, streamed"
    )
    entry_stage: ClassVar[str] = "preprocessing"
    default_model_path: ClassVar[str] = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
    api: ClassVar[tuple[str, ...]] = ("speech",)
    audio_stage: ClassVar[str | None] = "vocoder"
    sample_rate: ClassVar[int | None] = 24000

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [
            StageConfig(
                name="preprocessing",
                factory_path=f"{PACKAGE}:create_preprocessing",
                next="tts_engine",
                process="pipeline",
                factory=PreprocessingArgs(),
            ),
            EngineStageConfig(
                name="tts_engine",
                factory_path=f"{PACKAGE}:create_tts_engine",
                next="vocoder",
                stream_to=["vocoder"],
                process="pipeline",
                gpu=0,
                factory=EngineFactoryArgs(),
            ),
            StageConfig(
                name="vocoder",
                factory_path=f"{PACKAGE}:create_vocoder",
                terminal=True,
                process="pipeline",
                gpu=0,
                factory=VocoderArgs(),
            ),
        ]
