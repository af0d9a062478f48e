"""The topology and factory arguments speech pipelines share (torch-free).

A TTS-style pipeline is three stages in one process by default:
``preprocessing`` (text, voice and sampling checks, on the CPU) ->
``tts_engine`` (the autoregressive model, an engine stage that streams
codec frames as it makes them) -> ``vocoder`` (codes to audio, terminal).
:func:`tts_stages` declares it from the three factories' arguments;
:func:`chain` declares any straight line of stages (an ASR pipeline's
preprocessing -> asr -> decode, say). :class:`TTSPipeline` is a whole
TTS pipeline class, wanting only the family's names and argument classes.
:class:`SourceChecks` gives a ``PipelineConfig`` the plan-time model-path
checks of its :class:`~omni_core.kit.source.ModelSource`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from ..schema import (
    DType,
    EngineStageConfig,
    FactoryArgs,
    LoadFormat,
    PipelineConfig,
    StageConfig,
)
from .source import ModelSource, SourceProblem


class WeightArgs(FactoryArgs):
    """How a stage gets its weights: the checkpoint at model_path, or seeded random ones."""

    load_format: LoadFormat = "auto"  # dummy: seeded random weights from the configs
    seed: int = Field(default=0, ge=0)  # of dummy weights


class TypedWeightArgs(WeightArgs):
    """Weights in a dtype the stage's factory reads (``omni_core.engine.precision``'s names).

    ``checkpoint_config`` (under model_path) names the file whose ``torch_dtype``
    says the weights' dtype; ``release_dtype`` is assumed without one.
    """

    checkpoint_config: ClassVar[str] = "config.json"
    release_dtype: ClassVar[str] = "bfloat16"

    # auto/none: the checkpoint's dtype where the device computes it fast, else float32
    # (omni_core.engine.precision; omni plan prints the decision)
    dtype: DType | None = None


class ChunkArgs(FactoryArgs):
    """A streaming vocoder's chunking: a short first chunk, later ones doubling."""

    # frames in the first audio chunk; later chunks double up to max_chunk_frames
    chunk_frames: int = Field(default=4, ge=1)
    max_chunk_frames: int | None = Field(default=48, ge=1)  # none: all chunks equal
    # chunks of concurrent requests decoded together (default: 16 GPU, 1 CPU)
    max_batch_size: int | None = Field(default=None, ge=1)


class StreamingVocoderArgs(TypedWeightArgs, ChunkArgs):
    """A codec decoder streamed chunk by chunk, with state or with re-decoded context."""

    # none: stateful streaming, each frame decoded once, equal to a full decode;
    # a number: re-decode that many frames before every chunk (Qwen's releases use 25)
    left_context_frames: int | None = Field(default=None, ge=0)


class TTSPreprocessingArgs(FactoryArgs):
    """Per-request bounds a TTS preprocessing stage checks before any model work."""

    max_ref_audio_seconds: float = Field(default=30.0, gt=0)
    # per-request cap on audio frames; default: the model's generation_config
    max_frames: int | None = Field(default=None, ge=1)
    # tokens of each text field (input, instructions, ref_text), counted in a worker thread
    max_input_tokens: int = Field(default=8192, ge=1)


@dataclass(frozen=True)
class Step:
    """One stage of a :func:`chain`; its factory is ``create_<name>`` unless named."""

    name: str
    factory: FactoryArgs | None = None
    engine: bool = False  # an engine stage (it has engine.*)
    gpu: int | None = None
    stream: bool = False  # streams its outputs to the next stage as they come
    factory_name: str | None = None


def chain(package: str, steps: Sequence[Step], *, process: str = "pipeline") -> list[StageConfig]:
    """``steps`` wired one after the other in ``process``; the last one is terminal.

    ``package`` is the module holding the factories (imported only in the
    stage processes).
    """
    stages: list[StageConfig] = []
    for i, step in enumerate(steps):
        after = steps[i + 1].name if i + 1 < len(steps) else None
        wiring: dict[str, Any] = {"terminal": True} if after is None else {"next": after}
        if step.stream and after is not None:
            wiring["stream_to"] = [after]
        if step.factory is not None:
            wiring["factory"] = step.factory
        if step.gpu is not None:
            wiring["gpu"] = step.gpu
        kind = EngineStageConfig if step.engine else StageConfig
        stages.append(
            kind(
                name=step.name,
                factory_path=f"{package}:{step.factory_name or 'create_' + step.name}",
                process=process,
                **wiring,
            )
        )
    return stages


def tts_stages(
    package: str,
    *,
    preprocessing: FactoryArgs,
    engine: FactoryArgs,
    vocoder: FactoryArgs,
    process: str = "pipeline",
    gpu: int = 0,
) -> list[StageConfig]:
    """preprocessing -> tts_engine (streams its frames) -> vocoder, all in ``process``.

    The factories are ``create_preprocessing``, ``create_tts_engine`` and
    ``create_vocoder`` of ``package``; the engine and the vocoder share ``gpu``.
    """
    return chain(
        package,
        [
            Step("preprocessing", preprocessing),
            Step("tts_engine", engine, engine=True, gpu=gpu, stream=True),
            Step("vocoder", vocoder, gpu=gpu),
        ],
        process=process,
    )


class SourceChecks:
    """``PipelineConfig`` hooks answered by the class's ``model_source``.

    Mix in before ``PipelineConfig``; every stage whose factory arguments
    have ``load_format`` counts as loading weights from ``model_path``.
    """

    model_source: ClassVar[ModelSource]

    def weight_factories(self) -> dict[str, Any]:
        """Stage name -> factory arguments, for the stages that load weights."""
        return {
            stage.name: stage.factory
            for stage in self.stages  # type: ignore[attr-defined]
            if "load_format" in type(stage.factory).model_fields
        }

    def model_source_problems(self) -> list[SourceProblem]:
        factories = self.weight_factories()
        formats = {name: factory.load_format for name, factory in factories.items()}
        return self.model_source.problems(self.model_path, formats, factories)  # type: ignore[attr-defined]

    def fetch_model_source(self) -> None:
        """A hub id into the local cache (once, in the parent); presets and directories: as is."""
        self.model_source.resolve(self.model_path)  # type: ignore[attr-defined]


class TTSPipeline(SourceChecks, PipelineConfig):
    """A TTS-style pipeline: text in, 24 kHz speech out of ``vocoder``, in one process.

    A family names its ``pipeline_name``, ``aliases``, ``description``,
    ``default_model_path``, ``model_source``, the module of its factories
    (``stages_module``) and, where they differ from the kit's, the argument
    classes of its three stages.
    """

    entry_stage: ClassVar[str] = "preprocessing"
    api: ClassVar[tuple[str, ...]] = ("speech",)
    audio_stage: ClassVar[str | None] = "vocoder"
    sample_rate: ClassVar[int | None] = 24000
    stages_module: ClassVar[str]
    preprocessing_args: ClassVar[type[FactoryArgs]] = TTSPreprocessingArgs
    engine_args: ClassVar[type[FactoryArgs]] = TypedWeightArgs
    vocoder_args: ClassVar[type[FactoryArgs]] = StreamingVocoderArgs

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return tts_stages(
            cls.stages_module,
            preprocessing=cls.preprocessing_args(),
            engine=cls.engine_args(),
            vocoder=cls.vocoder_args(),
        )
