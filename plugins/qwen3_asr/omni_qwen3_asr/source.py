"""Where Qwen3-ASR checkpoints come from (torch-free; the kit's rules, this family's names)."""

from __future__ import annotations

from pathlib import Path

from omni_core.kit.source import ModelSource, ResolvedPath

PRESETS_DIR = Path(__file__).parent / "presets"
SOURCE = ModelSource(
    family="Qwen3-ASR",
    presets_dir=PRESETS_DIR,
    example="Qwen/Qwen3-ASR-1.7B",
    weights={"asr": ""},
)


def resolve_model_path(name: str, allow_download: bool = True) -> ResolvedPath:
    """A preset (``tiny``), a local checkpoint directory, or a hub id."""
    return SOURCE.resolve(name, allow_download)
