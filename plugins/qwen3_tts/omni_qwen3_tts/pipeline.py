"""The Qwen3-TTS pipeline: preprocessing -> tts_engine (streams) -> vocoder.

All three stages share the process ``pipeline`` by default: the model is small,
so payloads pass between stages as Python objects and one GPU holds the talker,
its code predictor and the speech-tokenizer decoder.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from omni_core import PipelineConfig, StageConfig
from omni_core.kit.pipeline import (
    ChunkArgs,
    SourceChecks,
    TTSPreprocessingArgs,
    TypedWeightArgs,
    tts_stages,
)

from .source import SOURCE  # torch-free

PACKAGE = "omni_qwen3_tts.stages"


PreprocessingArgs = TTSPreprocessingArgs  # max_frames' default: generation_config's


class EngineFactoryArgs(TypedWeightArgs):
    # CPU only: repack the talker's large float32 linear weights for oneDNN, which
    # streams them ~1.7x faster than MKL at decoding batch sizes (omni_core.engine.cpu_linear)
    pack_weights: bool = True


class VocoderArgs(TypedWeightArgs, ChunkArgs):
    # chunk_frames (4 frames = 0.32 s of audio): stateful decoding re-decodes
    # nothing, so a short first chunk costs ~5% more codec work in all and brings
    # the first audio 8 frames earlier than the release's 12.
    # none: stateful streaming, each frame decoded once, equal to a full decode;
    # a number: re-decode that many frames before every chunk (the release uses 25)
    left_context_frames: int | None = Field(default=None, ge=0)


class Qwen3TTSPipeline(SourceChecks, PipelineConfig):
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
    model_source: ClassVar = SOURCE

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return tts_stages(
            PACKAGE,
            preprocessing=PreprocessingArgs(),
            engine=EngineFactoryArgs(),
            vocoder=VocoderArgs(),
        )

    def builtin_voices(self) -> list[str] | None:
        """CustomVoice's named speakers (``talker_config.spk_id``); the others have none."""
        config = SOURCE.local_config(self.model_path)
        if config is None:
            return None
        speakers = (config.get("talker_config") or {}).get("spk_id") or {}
        if config.get("tts_model_type", "base") != "custom_voice":
            return []
        return sorted(str(name).lower() for name in speakers)
