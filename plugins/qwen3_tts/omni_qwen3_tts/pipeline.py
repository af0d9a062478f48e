"""The Qwen3-TTS pipeline: preprocessing -> tts_engine (streams) -> vocoder.

All three stages share the process ``pipeline`` by default: the model is small,
so payloads pass between stages as Python objects and one GPU holds the talker,
its code predictor and the speech-tokenizer decoder.
"""

from __future__ import annotations

from typing import ClassVar

from omni_core.kit.pipeline import StreamingVocoderArgs, TTSPipeline, TypedWeightArgs
from omni_core.schema import Quantization

from .source import SOURCE  # torch-free


class EngineFactoryArgs(TypedWeightArgs):
    # CPU only: repack the talker's large float32 linear weights for oneDNN, which
    # streams them ~1.7x faster than MKL at decoding batch sizes (omni_core.engine.cpu_linear)
    pack_weights: bool = True
    # int8: the talker's and code predictor's large linear layers as int8 weights with
    # per-channel scales (needs dtype bfloat16; omni_core.engine.quantize)
    quantization: Quantization = "none"
    # CPU, bf16: a float16 copy of each blocked linear weight for fbgemm's kernel, which
    # reads one or two rows 1.2-1.6x faster; the linear layers' memory twice over
    # (omni_core.engine.cpu_row_copy)
    fp16_row_weights: bool = False


class VocoderArgs(StreamingVocoderArgs):
    # the speech tokenizer's weights: released in float32, kept so by auto (bf16 audio is worse)
    checkpoint_config: ClassVar[str] = "speech_tokenizer/config.json"
    release_dtype: ClassVar[str] = "float32"
    # CPU, float32 decoder: every linear layer on the faster kernel for a chunk's row count
    # (oneDNN over MKL from a few rows on; omni_qwen3_tts.stages.route_float32_layers)
    pack_weights: bool = True
    # GPU: the streamed chunks run eagerly instead of as CUDA graphs (one per rows bucket and
    # chunk length, checked against eager at capture; omni_qwen3_tts.speech_tokenizer.stream_graphs)
    disable_cuda_graph: bool = False


class Qwen3TTSPipeline(TTSPipeline):
    pipeline_name: ClassVar[str] = "qwen3-tts"
    aliases: ClassVar[tuple[str, ...]] = (
        "qwen3_tts",
        "Qwen3TTSForConditionalGeneration",
        "Qwen3TTSPipelineConfig",
    )
    description: ClassVar[str] = (
        "Qwen3-TTS 12 Hz (Base / CustomVoice / VoiceDesign): text to 24 kHz speech, streamed"
    )
    default_model_path: ClassVar[str] = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
    voice_cloning: ClassVar[bool] = True  # Base checkpoints; the others refuse the upload
    model_source: ClassVar = SOURCE
    stages_module: ClassVar[str] = "omni_qwen3_tts.stages"
    engine_args: ClassVar = EngineFactoryArgs
    vocoder_args: ClassVar = VocoderArgs
    # the kit's StreamingVocoderArgs: chunk_frames 4 (0.32 s of audio); stateful
    # decoding re-decodes nothing, so a short first chunk costs ~5% more codec work
    # in all and brings the first audio 8 frames earlier than the release's 12

    def builtin_voices(self) -> list[str] | None:
        """CustomVoice's named speakers (``talker_config.spk_id``); the others have none."""
        config = SOURCE.local_config(self.model_path)
        if config is None:
            return None
        speakers = (config.get("talker_config") or {}).get("spk_id") or {}
        if config.get("tts_model_type", "base") != "custom_voice":
            return []
        return sorted(str(name).lower() for name in speakers)
