"""The Qwen3-TTS pipeline: preprocessing -> tts_engine (streams) -> vocoder.

All three stages share the process ``pipeline`` by default: the model is small,
so payloads pass between stages as Python objects and one GPU holds the talker,
its code predictor and the speech-tokenizer decoder.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from omni_core import EngineStageConfig, FactoryArgs, PipelineConfig, StageConfig
from omni_core.schema import DType, LoadFormat
from omni_core.schema.pipeline import SourceProblem

PACKAGE = "omni_qwen3_tts.stages"


class PreprocessingArgs(FactoryArgs):
    max_ref_audio_seconds: float = Field(default=30.0, gt=0)
    # per-request cap; default: generation_config max_new_tokens
    max_frames: int | None = Field(default=None, ge=1)
    # tokens of each text field (input, instructions, ref_text), counted in a worker thread
    max_input_tokens: int = Field(default=8192, ge=1)


class EngineFactoryArgs(FactoryArgs):
    dtype: DType | None = None  # default: bfloat16 on CUDA, float32 on CPU
    load_format: LoadFormat = "auto"  # dummy: seeded random weights
    seed: int = Field(default=0, ge=0)  # of dummy weights
    # CPU only: repack the talker's large float32 linear weights for oneDNN, which
    # streams them ~1.7x faster than MKL at decoding batch sizes (omni_core.engine.cpu_linear)
    pack_weights: bool = True


class VocoderArgs(FactoryArgs):
    dtype: DType | None = None
    load_format: LoadFormat = "auto"
    seed: int = Field(default=0, ge=0)
    # chunks decoded together (default: 16 GPU, 1 CPU)
    max_batch_size: int | None = Field(default=None, ge=1)
    # frames in the first audio chunk (4 frames = 0.32 s of audio): stateful decoding
    # re-decodes nothing, so a short first chunk costs ~5% more codec work in all and
    # brings the first audio 8 frames earlier than the release's 12
    chunk_frames: int = Field(default=4, ge=1)
    # later chunks double up to this (none: all equal)
    max_chunk_frames: int | None = Field(default=48, ge=1)
    # none: stateful streaming, each frame decoded once, equal to a full decode;
    # a number: re-decode that many frames before every chunk (the release uses 25)
    left_context_frames: int | None = Field(default=None, ge=0)


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
    voice_cloning: ClassVar[bool] = True  # Base checkpoints; the others refuse the upload

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

    def model_source_problems(self) -> list[SourceProblem]:
        from .source import source_problems  # torch-free

        formats = {
            stage.name: stage.factory.load_format
            for stage in self.stages
            if "load_format" in type(stage.factory).model_fields
        }
        return source_problems(self.model_path, formats)

    def fetch_model_source(self) -> None:
        """A hub id into the local cache (once, in the parent); presets and directories: as is."""
        from .source import resolve_model_path

        resolve_model_path(self.model_path)

    def builtin_voices(self) -> list[str] | None:
        """CustomVoice's named speakers (``talker_config.spk_id``); the others have none."""
        from .source import local_config  # torch-free

        config = local_config(self.model_path)
        if config is None:
            return None
        speakers = (config.get("talker_config") or {}).get("spk_id") or {}
        if config.get("tts_model_type", "base") != "custom_voice":
            return []
        return sorted(str(name).lower() for name in speakers)
