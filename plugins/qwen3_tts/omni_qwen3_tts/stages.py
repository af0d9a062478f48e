"""Stage factories of the Qwen3-TTS pipeline.

The model code (talker, code predictor, speech-tokenizer decoder) has not
landed yet; each factory says so at construction instead of pretending.
"""

from __future__ import annotations

from omni_core import NotImplementedYet


def _not_yet(stage: str) -> NotImplementedYet:
    return NotImplementedYet(
        f"omni-qwen3-tts: stage {stage!r} cannot be built yet: the Qwen3-TTS model code "
        "is not implemented in this release",
        hint="plan and inspect the deployment with `omni plan`; serving needs the model code",
    )


def create_preprocessing(model_path: str, max_ref_audio_seconds: float = 30.0):
    raise _not_yet("preprocessing")


def create_tts_engine(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    dtype: str = "bfloat16",
    load_format: str = "auto",
):
    raise _not_yet("tts_engine")


def create_vocoder(
    model_path: str,
    gpu_id: int | None = None,
    dtype: str = "float32",
    max_batch_size: int | None = None,
    chunk_frames: int = 12,
    left_context_frames: int = 25,
):
    raise _not_yet("vocoder")
