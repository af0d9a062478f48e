"""Where Qwen3-TTS weights come from, and what can be said of it without loading them.

Kept free of torch so that the parent process (``omni config``, ``omni plan``)
can refuse a model path the stages would fail on, before any process starts.
A model path is a preset (``tiny``: configs only, for ``load_format =
"dummy"``), a local checkpoint directory, or a hub id ``owner/name``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PRESETS_DIR = Path(__file__).parent / "presets"
LOAD_FORMATS = ("auto", "safetensors", "dummy")
# What a hub snapshot needs (the release also ships README / assets we do not read).
HUB_PATTERNS = [
    "*.json",
    "*.safetensors",
    "vocab.json",
    "merges.txt",
    "speech_tokenizer/*",
]


@dataclass(frozen=True)
class ResolvedPath:
    """A model directory on disk, and whether it is one of our presets (configs only)."""

    path: Path
    preset: str | None = None


def available_presets(presets_dir: Path = PRESETS_DIR) -> list[str]:
    if not presets_dir.is_dir():
        return []
    return sorted(p.name for p in presets_dir.iterdir() if (p / "config.json").is_file())


def resolve_model_path(
    name: str,
    allow_download: bool = True,
    *,
    presets_dir: Path = PRESETS_DIR,
    patterns: list[str] | None = None,
    family: str = "Qwen3-TTS",
) -> ResolvedPath:
    """A preset name (``tiny`` / ``preset:tiny``), a local directory, or a hub id.

    A hub id is fetched with ``huggingface_hub`` (from its cache first); when
    that fails (offline, unknown repo) the error says how to get the files.
    The Qwen3-Omni plugin resolves its own presets and hub files through this
    too (``presets_dir``, ``patterns``, ``family`` for the messages).
    """
    preset = name.removeprefix("preset:")
    if (presets_dir / preset / "config.json").is_file() and not Path(name).exists():
        return ResolvedPath(presets_dir / preset, preset=preset)
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{local}: not a {family} checkpoint (no config.json)")
        return ResolvedPath(local)
    if local.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        presets = ", ".join(available_presets(presets_dir)) or "none"
        raise FileNotFoundError(
            f"model {name!r} is neither a directory, a preset ({presets}) "
            "nor a hub id of the form owner/name"
        )
    if not allow_download:
        raise FileNotFoundError(f"model {name!r} is not a local directory and downloads are off")
    return ResolvedPath(download(name, patterns))


def local_config(model_path: str, presets_dir: Path = PRESETS_DIR) -> dict | None:
    """The ``config.json`` of a preset or a local checkpoint directory; None for a hub id.

    Torch-free and download-free: what the parent process can say about a
    model before any stage loads it (its voices, for instance).
    """
    import json

    preset = model_path.removeprefix("preset:")
    local = Path(model_path).expanduser()
    for root in (presets_dir / preset, local):
        if (root / "config.json").is_file() and (root == local or not local.exists()):
            try:
                return json.loads((root / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
    return None


def download(repo: str, patterns: list[str] | None = None) -> Path:
    """A hub snapshot of ``repo`` (the cache first), or FileNotFoundError saying how to get it."""
    patterns = patterns or HUB_PATTERNS
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - declared dependency
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


def source_problems(
    model_path: str, load_formats: Mapping[str, str]
) -> list[tuple[tuple[tuple[str, ...], ...], str, str]]:
    """What the stages would refuse in ``model_path``, as (paths, message, fix).

    ``load_formats`` maps each weight-loading stage to its ``factory.load_format``.
    Hub ids are not looked up here (that needs the network); local
    directories and presets are checked as the loaders will check them.
    """
    dummy = {stage for stage, fmt in load_formats.items() if fmt == "dummy"}
    real = [stage for stage in load_formats if stage not in dummy]
    preset = model_path.removeprefix("preset:")
    local = Path(model_path).expanduser()
    if (PRESETS_DIR / preset / "config.json").is_file() and not local.exists():
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
    if local.is_dir():
        return _directory_problems(local, model_path, real)
    if local.exists() or model_path.startswith((".", "/", "~")) or model_path.count("/") != 1:
        return [
            (
                (("model_path",),),
                f"model_path {model_path!r} is neither a directory, a preset "
                f"({', '.join(available_presets())}) nor a hub id of the form owner/name",
                "give a checkpoint directory (config.json, model.safetensors, "
                "speech_tokenizer/), a hub id such as Qwen/Qwen3-TTS-12Hz-0.6B-Base, or "
                "tiny with load_format dummy",
            )
        ]
    return hub_id_problems(model_path, "Qwen/Qwen3-TTS-12Hz-0.6B-Base")


HUB_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")


def hub_id_problems(
    model_path: str, example: str
) -> list[tuple[tuple[tuple[str, ...], ...], str, str]]:
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


def _directory_problems(
    local: Path, model_path: str, real: list[str]
) -> list[tuple[tuple[tuple[str, ...], ...], str, str]]:
    problems = []
    fix = "point model_path at the directory a Qwen3-TTS release unpacks to"
    if not (local / "config.json").is_file():
        problems.append(
            ((("model_path",),), f"{model_path}: not a Qwen3-TTS checkpoint (no config.json)", fix)
        )
        return problems
    wants = {"tts_engine": local, "vocoder": local / "speech_tokenizer"}
    for stage in real:
        directory = wants.get(stage)
        if directory is None:
            continue
        has = any(
            (directory / name).is_file()
            for name in ("model.safetensors", "model.safetensors.index.json")
        )
        if not has:
            problems.append(
                (
                    (("model_path",), ("stages", stage, "factory", "load_format")),
                    f"{directory}: no model.safetensors or model.safetensors.index.json, "
                    f"which stage {stage!r} loads",
                    f"{fix}, or --{stage}.factory.load_format dummy for random weights",
                )
            )
    return problems
