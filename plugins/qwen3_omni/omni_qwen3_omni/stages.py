"""Stage factories of the Qwen3-Omni pipelines.

The model code (encoders, MoE thinker and talker, code2wav) has not landed
yet; each factory says so at construction instead of pretending.
"""

from __future__ import annotations

from omni_core import NotImplementedYet


def _not_yet(stage: str) -> NotImplementedYet:
    return NotImplementedYet(
        f"omni-qwen3-omni: stage {stage!r} cannot be built yet: the Qwen3-Omni model code "
        "is not implemented in this release",
        hint="plan and inspect the deployment with `omni plan`; serving needs the model code",
    )


def create_preprocessing(model_path: str, max_audio_seconds: float = 300.0):
    raise _not_yet("preprocessing")


def create_image_encoder(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    dtype: str = "bfloat16",
    max_batch_size: int = 8,
):
    raise _not_yet("image_encoder")


def create_audio_encoder(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    dtype: str = "bfloat16",
    max_batch_size: int = 8,
):
    raise _not_yet("audio_encoder")


def create_mm_aggregate(model_path: str):
    raise _not_yet("mm_aggregate")


def create_thinker(
    model_path: str,
    gpu_id: int | None = None,
    gpu_ids: list[int] | None = None,
    gpu_memory_fraction: float | None = None,
    tp_rank: int = 0,
    tp_size: int = 1,
    dtype: str = "bfloat16",
    load_format: str = "auto",
):
    raise _not_yet("thinker")


def create_decode(model_path: str):
    raise _not_yet("decode")


def create_talker(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    dtype: str = "bfloat16",
    load_format: str = "auto",
    vocoder_in_process: bool = False,
):
    raise _not_yet("talker_ar")


def create_code2wav(
    model_path: str,
    gpu_id: int | None = None,
    gpu_memory_fraction: float | None = None,
    dtype: str = "float32",
    chunk_frames: int = 12,
    left_context_frames: int = 25,
):
    raise _not_yet("code2wav")
