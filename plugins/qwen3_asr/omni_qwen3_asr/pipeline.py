"""The ``qwen3-asr`` pipeline: preprocessing -> asr -> decode -> align, one process.

``asr`` is the engine stage (the seed's ``stages.asr.engine.*`` and
``stages.asr.factory.dtype``); it holds the audio tower and the decoder, so
the tower's rows never cross a process boundary. ``align`` passes the
transcript on as it streams and, when a request asks for word timings and
``factory.aligner_path`` names a Qwen3-ForcedAligner, times its words. Served
on ``/v1/audio/transcriptions`` and ``/v1/audio/translations``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from omni_core import FactoryArgs, PipelineConfig, StageConfig
from omni_core.kit.pipeline import SourceChecks, Step, TypedWeightArgs, chain
from omni_core.kit.source import ModelSource, SourceProblem
from omni_core.schema import DType, LoadFormat

from .plugin import CHECKPOINT_NAMES
from .source import SOURCE
from .split import MAX_ALIGNED_PIECE_SECONDS, MAX_PIECE_SECONDS


class PreprocessingArgs(FactoryArgs):
    # one clip per request, bounded before it is decoded: the whole clip, however it is cut
    max_audio_seconds: float = Field(default=300.0, gt=0)
    # longer clips are cut at quiet points into pieces of about this length, transcribed
    # separately and joined (the release's 1200 s; 180 s when word timings are asked, the
    # forced aligner's longest input): see omni_qwen3_asr.split
    max_piece_seconds: float = Field(default=MAX_PIECE_SECONDS, gt=0)
    max_aligned_piece_seconds: float = Field(default=MAX_ALIGNED_PIECE_SECONDS, gt=0)
    max_media_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    # tokens a transcript may take (the release's transformers backend: 512; vLLM: 4096)
    max_tokens: int = Field(default=4096, ge=1)
    # the prompt: the clip's rows (13 per second) and the context's tokens
    max_prompt_tokens: int = Field(default=32768, ge=1)


class ASRArgs(TypedWeightArgs):
    # requests whose clips the audio tower encodes in one call: those arriving while a
    # call runs join the next one (a lone request never waits)
    encoder_max_batch_size: int = Field(default=8, ge=1)


class AlignArgs(FactoryArgs):
    # a Qwen3-ForcedAligner checkpoint (a directory, a hub id, or the tiny-aligner preset):
    # word timings for verbose_json; none: a request for them is refused
    aligner_path: str | None = None
    aligner_load_format: LoadFormat = "auto"
    dtype: DType | None = None
    seed: int = Field(default=0, ge=0)  # of dummy aligner weights


class Qwen3ASRPipeline(SourceChecks, PipelineConfig):
    pipeline_name: ClassVar[str] = "qwen3-asr"
    aliases: ClassVar[tuple[str, ...]] = CHECKPOINT_NAMES
    description: ClassVar[str] = (
        "Qwen3-ASR: speech in, text out (language detected or forced, context prompt); "
        "audio tower and Qwen3 decoder in one engine stage"
    )
    entry_stage: ClassVar[str] = "preprocessing"
    default_model_path: ClassVar[str] = "Qwen/Qwen3-ASR-1.7B"
    api: ClassVar[tuple[str, ...]] = ("transcription",)
    text_stage: ClassVar[str | None] = "align"
    model_source: ClassVar[ModelSource] = SOURCE

    def model_source_problems(self) -> list[SourceProblem]:
        """The model's, and the aligner's (same rules), said about the aligner's settings."""
        problems = super().model_source_problems()
        align = {stage.name: stage for stage in self.stages}["align"].factory
        if align.aligner_path is None:
            return problems
        found = SOURCE.problems(align.aligner_path, {"align": align.aligner_load_format})
        return problems + [_about_aligner(problem) for problem in found]

    def fetch_model_source(self) -> None:
        super().fetch_model_source()
        align = {stage.name: stage for stage in self.stages}["align"].factory
        if align.aligner_path is not None:
            SOURCE.resolve(align.aligner_path)

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return chain(
            "omni_qwen3_asr.stages",
            [
                Step("preprocessing", PreprocessingArgs()),
                Step("asr", ASRArgs(), engine=True, gpu=0, stream=True),
                Step("decode", stream=True),
                Step("align", AlignArgs(), gpu=0),
            ],
        )


ALIGNER_PATH = ("stages", "align", "factory", "aligner_path")
ALIGNER_FORMAT = ("stages", "align", "factory", "aligner_load_format")


def _about_aligner(problem: SourceProblem) -> SourceProblem:
    """A model-source problem of the aligner's path, named by the aligner's own settings."""
    paths, message, fix = problem
    renamed = {
        ("model_path",): ALIGNER_PATH,
        ("stages", "align", "factory", "load_format"): ALIGNER_FORMAT,
    }
    words = (
        ("model_path", "stages.align.factory.aligner_path"),
        ("factory.load_format", "factory.aligner_load_format"),
        ("--align.factory.load_format", "--align.factory.aligner_load_format"),
        ("Qwen/Qwen3-ASR-1.7B", "Qwen/Qwen3-ForcedAligner-0.6B"),
        ("tiny with load_format dummy", "tiny-aligner with aligner_load_format dummy"),
    )
    for old, new in words:
        message, fix = message.replace(old, new), fix.replace(old, new)
    return tuple(renamed.get(p, p) for p in paths), message, fix
