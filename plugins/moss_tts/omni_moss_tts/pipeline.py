"""The MOSS-TTS pipeline: preprocessing -> tts_engine (delay-pattern decoding) -> vocoder.

One process ``pipeline``: the 8B backbone and the audio-tokenizer decoder
share GPU 0, and the vocoder receives codes as the engine produces them.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from omni_core.kit.pipeline import ChunkArgs, TTSPipeline, TypedWeightArgs
from omni_core.schema import DType, Quantization

from .codec_footprint import CAPTURED_ROWS  # torch-free
from .source import SOURCE  # torch-free

DEFAULT_VOICE = "default"  # the model's own voice: the release ships no named speakers


class EngineFactoryArgs(TypedWeightArgs):
    # the MOSS audio tokenizer checkpoint; default: processor_config.json's, else the hub's
    codec_path: str | None = None
    # CPU only: repack the backbone's float32 linear weights for oneDNN
    pack_weights: bool = True
    # int8: the backbone's large linear layers as int8 weights (needs dtype bfloat16)
    quantization: Quantization = "none"
    # CPU, bf16: a float16 copy of each blocked linear weight for fbgemm's kernel, which
    # reads one or two rows 1.2-1.6x faster; the linear layers' memory twice over
    # (omni_core.engine.cpu_row_copy)
    fp16_row_weights: bool = False


class VocoderArgs(TypedWeightArgs, ChunkArgs):
    # auto/none: float32 on every device, whatever the codec's config.json says, because
    # the release computes the codec in float32 (omni_moss_tts.loading says how we know);
    # bfloat16: the decoder's transformers in bf16, the quantizer and encoder float32
    checkpoint_config: ClassVar[str | None] = None
    release_dtype: ClassVar[str] = "float32"
    dtype: DType | None = None
    codec_path: str | None = None
    # CPU only: the decoder's linear layers (float32: every one) on the faster kernel for
    # each chunk's row count (float32: MKL up to 3 rows, oneDNN beyond; bf16: the routes
    # this machine measured)
    pack_weights: bool = True
    # frames in the first audio chunk (2 frames = 0.16 s): the delay pattern already
    # holds the first frame back 32 steps, so a short first chunk matters; later
    # chunks grow fourfold up to max_chunk_frames (default 16 chunks batched, on the CPU too)
    chunk_frames: int = Field(default=2, ge=1)
    # GPU: the streamed chunks run eagerly instead of as CUDA graphs (one per rows bucket and
    # chunk length, full windows shared, checked against eager; omni_moss_tts.codec.graphs)
    disable_cuda_graph: bool = False
    # GPU: the most streams a captured chunk decodes (buckets 1, 2, 4 ... up to it and to
    # max_batch_size); a larger batch runs eagerly. The graphs share one tensor of full
    # windows this many rows tall, 170 MB a row at the release's size in float32, which
    # the plan counts (omni plan's "CUDA graphs" in the vocoder's estimate: 1.41 GiB at 8,
    # 2.74 GiB at 16 for examples/moss_tts.toml)
    cuda_graph_max_bs: int = Field(default=CAPTURED_ROWS, ge=1)

    @field_validator("dtype")
    @classmethod
    def _no_float16(cls, value: str | None) -> str | None:
        if value in ("float16", "fp16"):
            raise ValueError(
                f"{value!r} is not implemented for the MOSS codec: the release computes it in "
                "float32 only, and only a bf16 decoder is checked against it; use auto "
                "(float32) or bfloat16"
            )
        return value


class MossTTSPipeline(TTSPipeline):
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
    default_model_path: ClassVar[str] = "OpenMOSS-Team/MOSS-TTS"
    voice_cloning: ClassVar[bool] = True
    model_source: ClassVar = SOURCE
    stages_module: ClassVar[str] = "omni_moss_tts.stages"
    # preprocessing: the kit's; max_frames counts audio frames, 12.5 per second
    engine_args: ClassVar = EngineFactoryArgs
    vocoder_args: ClassVar = VocoderArgs

    # The backbone splits over tp_size ranks (tensor_parallel.py says how)
    tensor_parallel_stages: ClassVar[tuple[str, ...]] = ("tts_engine",)

    def builtin_voices(self) -> list[str] | None:
        return [DEFAULT_VOICE]

    def tensor_parallel_sizes(self, stage: str) -> dict[str, int]:
        """What the backbone's split divides, from a local ``config.json`` (else unknown)."""
        config = SOURCE.local_config(self.model_path)
        if stage != "tts_engine" or not isinstance(config, dict):
            return {}
        from .config import MossTTSConfig, backbone_split_sizes

        try:
            return backbone_split_sizes(MossTTSConfig.from_dict(config))
        except Exception:  # a config the model-source checks refuse, saying why
            return {}
