"""The MOSS-TTS pipeline: preprocessing -> tts_engine (delay-pattern decoding) -> vocoder.

One process ``pipeline``: the 8B backbone and the audio-tokenizer decoder
share GPU 0, and the vocoder receives codes as the engine produces them.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from omni_core import EngineStageConfig, FactoryArgs, PipelineConfig, StageConfig
from omni_core.schema import DType, LoadFormat

PACKAGE = "omni_moss_tts.stages"


class PreprocessingArgs(FactoryArgs):
    max_ref_audio_seconds: float = Field(default=30.0, gt=0)


class EngineFactoryArgs(FactoryArgs):
    dtype: DType = "bfloat16"
    load_format: LoadFormat = "auto"


class VocoderArgs(FactoryArgs):
    dtype: DType = "float32"
    max_batch_size: int | None = Field(default=None, ge=1)
    chunk_frames: int = Field(default=12, ge=1)


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
