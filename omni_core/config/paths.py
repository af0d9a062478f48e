"""The path language: which paths exist in a deployment, and what each one is.

One language, two spellings. Deploy files write ``[stages.vocoder.factory]``
``max_batch_size = 16``; flags write ``--vocoder.factory.max_batch_size 16``.
Both become the canonical path ``stages.vocoder.factory.max_batch_size``,
checked here against the pipeline class: stages and processes must exist,
fields must be declared (free-form keys only inside ``factory``, ``engine``
and ``env``), and topology can never be addressed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, did_you_mean, suggestion
from ..schema import AUTHOR_ONLY_FIELDS, PLACEMENT_OWNED_FACTORY_KEYS, PipelineConfig
from ..schema.deployment import (
    ClusterConfig,
    EndpointsConfig,
    PlacementConfig,
    ProcessConfig,
    RayConfig,
    RuntimeConfig,
    ServerConfig,
)
from .coerce import BytesField
from .origin import Path, dotted

TOP_LEAVES = ("model_path", "mps", "weight_share")
TOP_GROUPS = {
    "placement": PlacementConfig,
    "cluster": ClusterConfig,
    "endpoints": EndpointsConfig,
    "runtime": RuntimeConfig,
    "ray": RayConfig,
    "server": ServerConfig,
}
STAGE_LEAVES = ("process", "gpu", "tp_size", "gpu_memory_fraction", "total_reserve_bytes")
BYTE_FIELDS = {
    ("stage", "total_reserve_bytes"),
    ("cluster", "gpu_memory"),
    ("server", "max_body_bytes"),
    ("server", "remote_media_max_bytes"),
}
TOP_LEVEL_NAMES = (*TOP_LEAVES, *TOP_GROUPS, "processes", "pipeline")


class PathError(ConfigError):
    """A path that does not exist or may not be written."""


@dataclass(frozen=True)
class Node:
    """What a canonical path addresses."""

    path: Path
    container: bool
    annotation: Any = None  # declared type of a leaf; None when free-form
    free_form: bool = False


def _annotation(model: type, field: str, *, kind: str) -> Any:
    if (kind, field) in BYTE_FIELDS:
        return BytesField
    return model.model_fields[field].annotation


class PathSchema:
    """The addressable paths of one pipeline class."""

    def __init__(self, pipeline_cls: type[PipelineConfig], defaults: PipelineConfig):
        self.cls = pipeline_cls
        self.defaults = defaults
        self.stages = {s.name: s for s in defaults.stages}
        self.processes = sorted({defaults.process_of(s) for s in defaults.stages})

    @property
    def label(self) -> str:
        return self.cls.pipeline_name or self.cls.__name__

    # -- the two spellings --------------------------------------------------
    def from_flag(self, text: str) -> Path:
        """Canonical path of a flag spelling: starts at a stage or a top-level field."""
        parts = tuple(text.split("."))
        if not all(parts):
            raise PathError(f"{text!r} is not a path: it has an empty segment")
        first = parts[0].replace("-", "_")
        if first == "stages":
            raise PathError(
                f"{text!r}: flags start at the stage name; the 'stages.' prefix is implied",
                hint="write --" + ".".join(parts[1:])
                if len(parts) > 1
                else "write --<stage>.<field>",
            )
        is_stage, is_top = first in self.stages, first in TOP_LEVEL_NAMES
        if is_stage and is_top:
            raise PathError(
                f"{first!r} is both a stage of {self.label} and a top-level field, so a flag "
                "cannot tell which one you mean",
                hint=f"set it in the deploy file under [stages.{first}] (or the top-level table)",
            )
        if is_stage:
            return ("stages", first, *parts[1:])
        if is_top:
            return (first, *parts[1:])
        raise PathError(
            f"{text!r} does not start from a stage name or a top-level field of {self.label}",
            hint=self._start_hint(first),
        )

    def _start_hint(self, first: str) -> str:
        hint = f"stages of this pipeline: {', '.join(self.stages)}; top-level fields: "
        hint += ", ".join(TOP_LEVEL_NAMES)
        close = did_you_mean(first, [*self.stages, *TOP_LEVEL_NAMES])
        return hint + (f"; did you mean: {close}" if close else "")

    def from_any(self, text: str) -> Path:
        """Either spelling: a full ``stages.…`` path or a flag spelling."""
        parts = tuple(text.split("."))
        if parts[0] == "stages":
            return parts
        return self.from_flag(text)

    # -- what a canonical path is ---------------------------------------------
    def node(self, path: Path) -> Node:
        for segment in path:
            if segment.lstrip("-").isdigit():
                raise PathError(
                    f"{dotted(path)}: numeric index {segment!r}; paths address whole values",
                    hint="write the whole list, e.g. --<stage>.gpu 0,1 or gpu = [0, 1]",
                )
        if not path:
            return Node((), container=True)
        head, rest = path[0], path[1:]
        if head in TOP_LEAVES:
            return self._leaf(path, PipelineConfig.model_fields[head].annotation, rest)
        if head in TOP_GROUPS:
            return self._model_node(path, TOP_GROUPS[head], kind=head)
        if head == "processes":
            return self._process_node(path)
        if head == "stages":
            return self._stage_node(path)
        raise PathError(
            f"{dotted(path)}: {head!r} is not a field of a deployment",
            hint=self._start_hint(head),
        )

    def _leaf(self, path: Path, annotation: Any, rest: Path, free: bool = False) -> Node:
        """``path`` as written (``rest``: its segments below the value, which must be none)."""
        if rest:
            value = dotted(path[: len(path) - len(rest)])
            table = getattr(annotation, "__origin__", None) is dict or str(annotation).startswith(
                "dict"
            )
            raise PathError(
                f"{dotted(path)}: {value} is a single value, not a group",
                hint=f"write the whole table, e.g. --{value.removeprefix('stages.')} "
                "'{key = \"value\"}'"
                if table
                else f"write {value} = VALUE",
            )
        return Node(path, container=False, annotation=annotation, free_form=free)

    def _model_node(self, path: Path, model: type, *, kind: str, depth: int = 1) -> Node:
        if len(path) == depth:
            return Node(path, container=True)
        field = path[depth]
        if field not in model.model_fields:
            raise PathError(
                f"{dotted(path)}: {dotted(path[:depth])} has no field {field!r}",
                hint=suggestion(field, model.model_fields, kind="fields"),
            )
        return self._leaf(path, _annotation(model, field, kind=kind), path[depth + 1 :])

    def _process_node(self, path: Path) -> Node:
        if len(path) == 1:
            return Node(path, container=True)
        # A process name is checked once the stages are built (PipelineConfig's
        # validator): a deploy file may name a process it creates itself with
        # ``[stages.X] process = "..."``, which the defaults do not know.
        return self._model_node(path, ProcessConfig, kind="process", depth=2)

    def _stage_node(self, path: Path) -> Node:
        if len(path) == 1:
            return Node(path, container=True)
        name = path[1]
        if name not in self.stages:
            raise PathError(
                f"{dotted(path)}: {self.label} has no stage {name!r}",
                hint=suggestion(name, self.stages, kind="stages of this pipeline"),
            )
        stage = self.stages[name]
        if len(path) == 2:
            return Node(path, container=True)
        field, rest = path[2], path[3:]
        if field in AUTHOR_ONLY_FIELDS:
            raise PathError(
                f"{dotted(path)}: {field!r} is topology, which lives in the code of the "
                f"pipeline class {self.cls.__module__}.{self.cls.__name__}",
                hint="deploy files and flags change the settings of existing stages; they never "
                "rewire, add or remove stages",
            )
        if field in STAGE_LEAVES:
            return self._leaf(path[:3], _annotation(type(stage), field, kind="stage"), rest)
        if field == "env":
            if not rest:
                return Node(path, container=True)
            return self._leaf(path[:4], str, rest[1:], free=True)
        if field == "factory" or (field == "engine" and stage.is_engine):
            return self._group_node(path, getattr(stage, field))
        if field == "engine":
            raise PathError(
                f"{dotted(path)}: stage {name!r} is not an engine stage, so it has no engine.* "
                "settings",
                hint=f"engine stages of {self.label}: "
                + (", ".join(s for s, st in self.stages.items() if st.is_engine) or "(none)"),
            )
        fields = [*STAGE_LEAVES, "env", "factory", *(["engine"] if stage.is_engine else [])]
        raise PathError(
            f"{dotted(path)}: stage {name!r} has no field {field!r}",
            hint=suggestion(field, fields, kind="fields of a stage"),
        )

    def _group_node(self, path: Path, group: Any) -> Node:
        if len(path) == 3:
            return Node(path, container=True)
        key = path[3]
        if path[2] == "factory" and key in PLACEMENT_OWNED_FACTORY_KEYS:
            raise PathError(
                f"{dotted(path)}: {key!r} is owned by placement and is passed to the factory "
                "by the planner",
                hint=f"set stages.{path[1]}.gpu, gpu_memory_fraction or total_reserve_bytes",
            )
        declared = type(group).model_fields
        if key in declared:
            return self._leaf(path[:4], declared[key].annotation, path[4:])
        return self._leaf(path[:4], None, path[4:], free=True)

    # -- enumerating ------------------------------------------------------------
    def flag_spelling(self, path: Path) -> str:
        return dotted(path[1:]) if path[0] == "stages" else dotted(path)
