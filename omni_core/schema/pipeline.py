"""A pipeline: its topology (class-level, author-only) and its deployment settings.

A model plugin subclasses :class:`PipelineConfig`, sets the class attributes
and implements :meth:`PipelineConfig.default_stages`. An instance is one
deployment of that pipeline: the stages with their settings, plus processes,
MPS, weight sharing, placement and endpoints.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, model_validator

from ..errors import suggestion
from .deployment import (
    ClusterConfig,
    EndpointsConfig,
    PlacementConfig,
    ProcessConfig,
    RayConfig,
    RuntimeConfig,
    ServerConfig,
)
from .stage import StageConfig

SourceProblem = tuple[tuple[tuple[str, ...], ...], str, str]
"""(paths the problem concerns, message, fix) from :meth:`PipelineConfig.model_source_problems`."""


class PipelineConfig(BaseModel):
    """Base class of every pipeline declaration."""

    # defer_build, here and on every schema model (subclasses inherit it): validators are
    # built on first use, so `omni plugins list`, which imports every pipeline, builds none.
    model_config = ConfigDict(extra="forbid", defer_build=True)

    # -- class-level topology: written by the plugin author only ----------
    pipeline_name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    entry_stage: ClassVar[str] = ""
    default_model_path: ClassVar[str] = ""
    default_placement_policy: ClassVar[str] = "declared"

    # -- serving: which OpenAI-style endpoints the pipeline answers ---------
    api: ClassVar[tuple[str, ...]] = ()
    """``"speech"`` (POST /v1/audio/speech) and/or ``"chat"`` (POST /v1/chat/completions)."""
    audio_stage: ClassVar[str | None] = None
    """The terminal stage whose chunks are audio: 1-D float32 samples in [-1, 1]."""
    text_stage: ClassVar[str | None] = None
    """The terminal stage whose chunks are text deltas (str)."""
    sample_rate: ClassVar[int | None] = None
    """Sample rate of the audio stage's output."""
    speech_input: ClassVar[Literal["read", "answer"]] = "read"
    """What a speech request's ``input`` is: ``"read"``, text the pipeline reads aloud
    (a TTS model), or ``"answer"``, a message the model answers aloud (Qwen3-Omni: its
    preprocessing turns ``input`` into a user turn). Clients (the playground) say which."""
    voice_cloning: ClassVar[bool] = False
    """Whether the pipeline can clone a voice from a clip (``POST /v1/audio/voices``).

    If so, it handles the two requests of the voices contract (CONTRIBUTING:
    "Voices"): an enrollment (``params["api"] == "voice"``) whose audio stage's
    final output carries ``voice_prompt``, and a speech request carrying a
    stored ``voice_prompt``. A checkpoint that turns out unable (Qwen3-TTS
    CustomVoice, say) refuses the enrollment with a RequestError saying why.
    """
    tensor_parallel_stages: ClassVar[tuple[str, ...]] = ()
    """Stages whose factory splits the weights over ``tp_size`` ranks (one process each,
    ``omni_core.engine.tp``); ``tp_size > 1`` on any other stage is refused at planning,
    unless its engine backend runs its ranks itself (SGLang)."""

    # -- deployment settings ------------------------------------------------
    model_path: str = ""
    stages: list[SerializeAsAny[StageConfig]] = []  # not default_factory=list: see stage.py
    processes: dict[str, ProcessConfig] = Field(default_factory=dict)
    mps: Literal["off", "on", "auto"] = "off"
    weight_share: Literal["off", "on"] = "off"
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    endpoints: EndpointsConfig = Field(default_factory=EndpointsConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        """The stages of this pipeline with their default settings, in build order."""
        raise NotImplementedError(f"{cls.__name__} must implement default_stages()")

    def model_source_problems(self) -> list[SourceProblem]:
        """What the stages would refuse in ``model_path``, found without loading anything.

        Called in the parent before any process starts (``omni config``,
        ``omni plan``, ``omni serve``), so it must not import torch. Each
        problem is ``(paths, message, fix)``; the paths (``("model_path",)``,
        ``("stages", "x", "factory", "load_format")``) let the error name who
        wrote the value. The default refuses a local-looking path (absolute,
        ``./``, ``~``) that does not exist; pipelines override it to say more
        (presets, the files a checkpoint must have).
        """
        path = self.model_path
        if path.startswith(("/", "./", "../", "~")) and not os.path.exists(
            os.path.expanduser(path)
        ):
            return [
                (
                    (("model_path",),),
                    f"model_path {path!r} does not exist",
                    "give the checkpoint directory, or a hub id such as owner/name",
                )
            ]
        return []

    def fetch_model_source(self) -> None:
        """Bring ``model_path``'s files onto this machine (a hub id into the local cache).

        Called by ``omni serve`` and ``omni run`` in the parent, after the
        checks and before any process starts, so that a hub id that cannot be
        had (a typo, no network) is one configuration error naming the setting
        instead of every stage process failing with a traceback, and so that
        a download happens once, not once per process. Raise
        ``FileNotFoundError`` with a one-line reason. Torch-free. The default
        fetches nothing (a pipeline that reads only local paths).
        """

    def tensor_parallel_sizes(self, stage: str) -> dict[str, int]:
        """The sizes a ``tp_size`` of ``stage`` must divide (``{"KV heads": 4, ...}``).

        Read from the checkpoint's config without loading it (torch-free);
        empty when unknown here (a hub id not downloaded yet): the factory
        then refuses an indivisible size when it loads.
        """
        return {}

    def tensor_parallel_problems(self) -> list[SourceProblem]:
        """``tp_size > 1`` where no rank processes or engine ranks can run it, or where it
        does not divide the model (see :mod:`omni_core.schema.tensor_parallel`)."""
        from .tensor_parallel import tensor_parallel_problems

        return tensor_parallel_problems(self)

    def builtin_voices(self) -> list[str] | None:
        """The model's own voice names, read without loading it (torch-free).

        ``GET /v1/audio/voices`` lists them and an unknown ``voice`` is refused
        with them; ``None`` means unknown here (a hub id not yet downloaded):
        the pipeline's stages then judge each name themselves.
        """
        return None

    @classmethod
    def engine_stage_names(cls) -> list[str]:
        return [s.name for s in cls.default_stages() if s.is_engine]

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if not data.get("stages"):
                data["stages"] = cls.default_stages()
            data.setdefault("model_path", cls.default_model_path)
            placement = data.get("placement")
            if placement is None:
                data["placement"] = PlacementConfig(policy=cls.default_placement_policy)
            elif isinstance(placement, dict) and "policy" not in placement:
                # Setting a limit must not silently swap the pipeline's policy.
                data["placement"] = {"policy": cls.default_placement_policy, **placement}
        return data

    @model_validator(mode="after")
    def _check_topology(self) -> PipelineConfig:
        problems = list(self._topology_problems())
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _topology_problems(self):
        names = [s.name for s in self.stages]
        seen: set[str] = set()
        for name in names:
            if name in seen:
                yield (
                    f"stage {name!r}: field 'name' is used by two stages; "
                    "stage names must be unique"
                )
            seen.add(name)
        if not self.stages:
            yield "the pipeline declares no stages"
        if self.entry_stage and self.entry_stage not in seen:
            yield (
                f"field 'entry_stage' names stage {self.entry_stage!r}, which does not exist; "
                + suggestion(self.entry_stage, seen, kind="stages of this pipeline")
            )
        for stage in self.stages:
            for field, refs in (
                ("next", stage.targets),
                ("wait_for", stage.wait_for or []),
                ("stream_to", stage.stream_to),
            ):
                for ref in refs:
                    if ref not in seen:
                        yield (
                            f"stage {stage.name!r}: field {field!r} names stage {ref!r}, which "
                            "does not exist; "
                            + suggestion(ref, seen, kind="stages of this pipeline")
                        )

    def process_problems(self) -> list[SourceProblem]:
        """``[processes.NAME]`` tables naming a process no stage runs in (with their paths,
        so the error says who wrote them)."""
        known = {self.process_of(s) for s in self.stages}
        return [
            (
                tuple(
                    ("processes", name, key)
                    for key in sorted(self.processes[name].model_fields_set)
                ),
                f"processes.{name}: no stage runs in a process called {name!r}",
                suggestion(name, known, kind="processes of this deployment"),
            )
            for name in self.processes
            if name not in known
        ]

    # -- lookups ------------------------------------------------------------
    @property
    def stage_names(self) -> list[str]:
        return [s.name for s in self.stages]

    def stage(self, name: str) -> StageConfig:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    @staticmethod
    def process_of(stage: StageConfig) -> str:
        """The logical process of a stage (a TP stage without one is named after itself)."""
        return stage.process or stage.name

    def process_config(self, process: str) -> ProcessConfig:
        return self.processes.get(process, ProcessConfig())
