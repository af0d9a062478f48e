"""The MOSS-TTS pipeline: preprocessing -> tts_engine (delay-pattern decoding) -> vocoder.

One process ``pipeline``: the 8B backbone and the audio-tokenizer decoder
share GPU 0, and the vocoder receives codes as the engine produces them.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from omni_core import EngineStageConfig, FactoryArgs, PipelineConfig, StageConfig
from omni_core.schema import DType, LoadFormat
from omni_core.schema.pipeline import SourceProblem

PACKAGE = "omni_moss_tts.stages"
DEFAULT_VOICE = "default"  # the model's own voice: the release ships no named speakers


class PreprocessingArgs(FactoryArgs):
    max_ref_audio_seconds: float = Field(default=30.0, gt=0)
    # per-request cap on audio frames (12.5 per second); default: generation_config's
    max_frames: int | None = Field(default=None, ge=1)
    # tokens of each text field (input, instructions, ref_text), counted in a worker thread
    max_input_tokens: int = Field(default=8192, ge=1)


class EngineFactoryArgs(FactoryArgs):
    dtype: DType | None = None  # default: bfloat16 on CUDA, float32 on CPU
    load_format: LoadFormat = "auto"  # dummy: seeded random weights
    seed: int = Field(default=0, ge=0)  # of dummy weights
    # the MOSS audio tokenizer checkpoint; default: processor_config.json's, else the hub's
    codec_path: str | None = None
    # CPU only: repack the backbone's float32 linear weights for oneDNN
    pack_weights: bool = True


class VocoderArgs(FactoryArgs):
    load_format: LoadFormat = "auto"
    seed: int = Field(default=0, ge=0)
    codec_path: str | None = None
    # frames in the first audio chunk (2 frames = 0.16 s): the delay pattern already
    # holds the first frame back 32 steps, so a short first chunk matters; later
    # chunks double up to max_chunk_frames
    chunk_frames: int = Field(default=2, ge=1)
    max_chunk_frames: int | None = Field(default=48, ge=1)
    # chunks of concurrent requests decoded together (default 16, on the CPU too)
    max_batch_size: int | None = Field(default=None, ge=1)


class MossTTSPipeline(PipelineConfig):
    pipeline_name: ClassVar[str] = "moss-tts"
    aliases: ClassVar[tuple[str, ...]] = (
        "moss_tts",
        "moss_tts_delay",
        "MossTTSDelayModel",
        "MossTTSPipelineConfig",
    )
    description: ClassVar[str] = (
        "MOSS-TTS (Qwen3 backbone, 32-codebook delay pattern): text to 24 kHz speech"
    )
    entry_stage: ClassVar[str] = "preprocessing"
    default_model_path: ClassVar[str] = "OpenMOSS-Team/MOSS-TTS"
    api: ClassVar[tuple[str, ...]] = ("speech",)
    audio_stage: ClassVar[str | None] = "vocoder"
    sample_rate: ClassVar[int | None] = 24000
    voice_cloning: ClassVar[bool] = True

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

        formats, codecs = {}, {}
        for stage in self.stages:
            fields = type(stage.factory).model_fields
            if "load_format" in fields:
                formats[stage.name] = stage.factory.load_format
            if "codec_path" in fields:
                codecs[stage.name] = stage.factory.codec_path
        return source_problems(self.model_path, formats, codecs)

    def fetch_model_source(self) -> None:
        """A hub id into the local cache (once, in the parent); presets and directories: as is."""
        from .source import resolve_model

        resolve_model(self.model_path)

    def builtin_voices(self) -> list[str] | None:
        return [DEFAULT_VOICE]
