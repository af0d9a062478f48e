"""Where Qwen3-TTS weights come from, and what can be said of it without loading them.

Kept free of torch so that the parent process (``omni config``, ``omni plan``)
can refuse a model path the stages would fail on, before any process starts.
A model path is a preset (``tiny``: configs only, for ``load_format =
"dummy"``), a local checkpoint directory, or a hub id ``owner/name``; the
rules are the kit's (:mod:`omni_core.kit.source`), the layout is ours: the
talker's weights at the top, the codec's under ``speech_tokenizer/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from omni_core.kit.source import (  # noqa: F401 - re-exported: this plugin's names for them
    HUB_FILES,
    LOAD_FORMATS,
    ModelSource,
    ResolvedPath,
    SourceProblem,
    hub_id_problems,
)
from omni_core.kit.source import download as _download

PRESETS_DIR = Path(__file__).parent / "presets"
# What a hub snapshot needs (the release also ships README / assets we do not read).
HUB_PATTERNS = [*HUB_FILES, "speech_tokenizer/*"]
SOURCE = ModelSource(
    family="Qwen3-TTS",
    presets_dir=PRESETS_DIR,
    example="Qwen/Qwen3-TTS-12Hz-0.6B-Base",
    hub_patterns=HUB_PATTERNS,
    weights={"tts_engine": "", "vocoder": "speech_tokenizer"},
    layout="config.json, model.safetensors, speech_tokenizer/",
)


def available_presets() -> list[str]:
    return SOURCE.presets()


def resolve_model_path(name: str, allow_download: bool = True) -> ResolvedPath:
    """A preset name (``tiny`` / ``preset:tiny``), a local directory, or a hub id."""
    return SOURCE.resolve(name, allow_download)


def local_config(model_path: str) -> dict | None:
    """The ``config.json`` of a preset or a local checkpoint directory; None for a hub id."""
    return SOURCE.local_config(model_path)


def download(repo: str, patterns: list[str] | None = None) -> Path:
    """A hub snapshot of ``repo`` (these patterns unless told), or a FileNotFoundError."""
    return _download(repo, patterns or HUB_PATTERNS)


def source_problems(model_path: str, load_formats: Mapping[str, str]) -> list[SourceProblem]:
    """What the stages would refuse in ``model_path``, as (paths, message, fix)."""
    return SOURCE.problems(model_path, load_formats)
