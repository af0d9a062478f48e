"""Where a model's files come from, and what can be said of them without loading them.

Torch-free, so the parent process (``omni config``, ``omni plan``) can refuse
a model path the stages would fail on before any process starts. A model
path is one of three things, tried in this order:

1. a preset of the plugin (``tiny`` or ``preset:tiny``): configs and
   tokenizer files without weights, loadable only with
   ``load_format = "dummy"``;
2. a local checkpoint directory (``config.json`` + ``model.safetensors`` or
   a sharded index);
3. a hub id ``owner/name``: checked for its form here (and against the local
   cache when ``HF_HUB_OFFLINE`` is set), fetched once in the parent by
   :meth:`ModelSource.resolve`.

A family describes its layout once, as a :class:`ModelSource`; a family with
a second checkpoint (MOSS-TTS's codec) subclasses it and adds to
:meth:`ModelSource.directory_problems`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOAD_FORMATS = ("auto", "safetensors", "dummy")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
HUB_FILES = ("*.json", "*.safetensors", "vocab.json", "merges.txt", "*.jinja")
"""What a hub snapshot of every family here needs: configs, weights, the Qwen BPE
tokenizer's files and a chat template; a family adds its own (a codec's directory)."""
HUB_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")

SourceProblem = tuple[tuple[tuple[str, ...], ...], str, str]
"""(config paths the problem concerns, message, fix): ``PipelineConfig.model_source_problems``."""


@dataclass(frozen=True)
class ResolvedPath:
    """A model directory on disk, and whether it is one of a plugin's presets (configs only)."""

    path: Path
    preset: str | None = None


@dataclass(frozen=True)
class ModelSource:
    """One family's model paths: its presets, hub files and which stage loads what.

    ``weights`` maps each stage that loads weights from the model path to the
    subdirectory holding its ``model.safetensors`` (``""``: the model
    directory itself); a stage not named there is not checked here. None:
    every weight-loading stage reads the model directory itself.
    ``layout`` says, in a fix message, what a checkpoint directory holds.
    """

    family: str
    presets_dir: Path
    example: str  # a hub id of the family, for messages
    hub_patterns: Sequence[str] = HUB_FILES
    weights: Mapping[str, str] | None = None
    layout: str = "config.json, model.safetensors"

    def presets(self) -> list[str]:
        """The presets shipped with the plugin: directories holding a ``config.json``."""
        if not self.presets_dir.is_dir():
            return []
        return sorted(p.name for p in self.presets_dir.iterdir() if (p / "config.json").is_file())

    def preset(self, name: str) -> str | None:
        """The preset ``name`` names, unless a local path of that name exists (it wins)."""
        preset = name.removeprefix("preset:")
        if (self.presets_dir / preset / "config.json").is_file() and not Path(name).exists():
            return preset
        return None

    def resolve(self, name: str, allow_download: bool = True) -> ResolvedPath:
        """A preset, a local directory, or a hub id fetched with ``huggingface_hub``.

        The hub is asked only after its local cache; when both fail (offline,
        unknown repo) the error says how to get the files.
        """
        preset = self.preset(name)
        if preset is not None:
            return ResolvedPath(self.presets_dir / preset, preset=preset)
        local = Path(name).expanduser()
        if local.is_dir():
            if not (local / "config.json").is_file():
                raise FileNotFoundError(f"{local}: not a {self.family} checkpoint (no config.json)")
            return ResolvedPath(local)
        if not looks_like_hub_id(name):
            raise FileNotFoundError(
                f"model {name!r} is neither a directory, a preset ({self._listed()}) "
                "nor a hub id of the form owner/name"
            )
        if not allow_download:
            raise FileNotFoundError(
                f"model {name!r} is not a local directory and downloads are off"
            )
        return ResolvedPath(download(name, list(self.hub_patterns)))

    def local_config(self, model_path: str) -> dict | None:
        """``config.json`` of a preset or local directory; None for a hub id or a bad file.

        Download-free: what the parent can say of a model before loading it
        (its voices, its shapes for a memory estimate).
        """
        preset = self.preset(model_path)
        root = self.presets_dir / preset if preset else Path(model_path).expanduser()
        try:
            return json.loads((root / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def problems(
        self,
        model_path: str,
        load_formats: Mapping[str, str],
        factories: Mapping[str, Any] | None = None,
    ) -> list[SourceProblem]:
        """What the stages would refuse in ``model_path``, as (paths, message, fix).

        ``load_formats`` maps each weight-loading stage to its ``factory.load_format``;
        ``factories`` to its factory arguments, for checks of other fields.
        """
        real = [stage for stage, fmt in load_formats.items() if fmt != "dummy"]
        if self.preset(model_path) is not None:
            return [
                (
                    (("model_path",), ("stages", stage, "factory", "load_format")),
                    f"model_path {model_path!r} is a built-in preset of configs without weights, "
                    f'so stage {stage!r} needs factory.load_format = "dummy" '
                    f"(it is {load_formats[stage]!r})",
                    f"--{stage}.factory.load_format dummy, or a real checkpoint as model_path",
                )
                for stage in real
            ]
        local = Path(model_path).expanduser()
        if local.is_dir():
            if not (local / "config.json").is_file():
                return [
                    (
                        (("model_path",),),
                        f"{model_path}: not a {self.family} checkpoint (no config.json)",
                        self._fix(),
                    )
                ]
            return self.directory_problems(local, real, factories or {})
        if not looks_like_hub_id(model_path):
            return [
                (
                    (("model_path",),),
                    f"model_path {model_path!r} is neither a directory, a preset "
                    f"({self._listed()}) nor a hub id of the form owner/name",
                    f"give a checkpoint directory ({self.layout}), a hub id such as "
                    f"{self.example}, or tiny with load_format dummy",
                )
            ]
        return hub_id_problems(model_path, self.example)

    def directory_problems(
        self, local: Path, real: list[str], factories: Mapping[str, Any]
    ) -> list[SourceProblem]:
        """A checkpoint directory's problems for the stages that load real weights.

        Override to check more (a second checkpoint a stage's factory names).
        """
        problems: list[SourceProblem] = []
        for stage in real:
            subdir = "" if self.weights is None else self.weights.get(stage)
            if subdir is None:
                continue
            directory = local / subdir
            if not any((directory / name).is_file() for name in WEIGHT_FILES):
                problems.append(
                    (
                        (("model_path",), ("stages", stage, "factory", "load_format")),
                        f"{directory}: no model.safetensors or model.safetensors.index.json, "
                        f"which stage {stage!r} loads",
                        f"{self._fix()}, or --{stage}.factory.load_format dummy for random weights",
                    )
                )
        return problems

    def _fix(self) -> str:
        return f"point model_path at the directory a {self.family} release unpacks to"

    def _listed(self) -> str:
        return ", ".join(self.presets()) or "none"


def looks_like_hub_id(name: str) -> bool:
    """``owner/name`` and nothing on disk by that name (the form is checked by hub_id_problems)."""
    return not (
        Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.count("/") != 1
    )


def download(repo: str, patterns: list[str]) -> Path:
    """A hub snapshot of ``repo`` (the cache first), or FileNotFoundError saying how to get it."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - a declared dependency of the plugins
        raise FileNotFoundError(
            f"model {repo!r} is a hub id but huggingface_hub is not installed"
        ) from exc
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns, etag_timeout=10))
    except Exception as exc:
        raise FileNotFoundError(
            f"could not fetch hub model {repo!r}: {_why(exc)}. On a machine with network "
            f"run `hf download {repo} --local-dir DIR` and pass DIR as the model path "
            "(or pre-fill the Hugging Face cache)."
        ) from None


def _why(exc: Exception) -> str:
    """One line on why a hub fetch failed: the hub's errors run to several paragraphs."""
    kind = type(exc).__name__
    if kind in ("RepositoryNotFoundError", "GatedRepoError"):
        return "the hub has no such repository, or it is private or gated (check the spelling)"
    if kind == "RevisionNotFoundError":
        return "the hub has no such revision of it"
    if kind == "LocalEntryNotFoundError" or isinstance(exc, (ConnectionError, OSError)):
        return "it is not in the local Hugging Face cache and the hub cannot be reached"
    if kind == "EntryNotFoundError":
        return f"a file of it is missing on the hub ({str(exc).splitlines()[0]})"
    return f"{kind}: {str(exc).splitlines()[0] if str(exc) else ''}"


def hub_id_problems(model_path: str, example: str) -> list[SourceProblem]:
    """What can be said of a hub id without the network: its form, and, when downloads
    are off (``HF_HUB_OFFLINE``), whether the local cache has it."""
    owner, _, name = model_path.partition("/")
    bad = [part for part in (owner, name) if not HUB_NAME.match(part) or ".." in part]
    if bad or "--" in model_path:
        return [
            (
                (("model_path",),),
                f"model_path {model_path!r} is not a valid hub id: {bad[0] if bad else '--'!r} "
                "(letters, digits, '.', '_', '-', not at either end, at most 96 characters)",
                f"check the spelling; a hub id looks like {example}",
            )
        ]
    if _offline() and not _cached(model_path):
        return [
            (
                (("model_path",),),
                f"model_path {model_path!r} is not in the local Hugging Face cache "
                f"({_cache_dir()}) and downloads are off (HF_HUB_OFFLINE)",
                f"check the spelling, or fetch it where the network is (`hf download "
                f"{model_path}`) into that cache, or unset HF_HUB_OFFLINE",
            )
        ]
    return []


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cache_dir() -> Path:
    """Where huggingface_hub keeps snapshots (its own rules, read without importing it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _cached(repo: str) -> bool:
    snapshots = _cache_dir() / f"models--{repo.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())
