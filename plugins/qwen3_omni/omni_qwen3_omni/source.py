"""Where Qwen3-Omni weights come from, checked without loading them (no torch here).

A model path is a preset (``tiny``: configs and tokenizer only, for
``load_format = "dummy"``), a local checkpoint directory, or a hub id
``owner/name``: the kit's rules (:mod:`omni_core.kit.source`). Every
weight-loading stage reads the one checkpoint directory.
"""

from __future__ import annotations

from pathlib import Path

from omni_core.kit.source import ModelSource, ResolvedPath

PRESETS_DIR = Path(__file__).parent / "presets"
SOURCE = ModelSource(
    family="Qwen3-Omni",
    presets_dir=PRESETS_DIR,
    example="Qwen/Qwen3-Omni-30B-A3B-Instruct",
)


def resolve_model_path(name: str, allow_download: bool = True) -> ResolvedPath:
    """A preset of this plugin, a local directory, or a hub id."""
    return SOURCE.resolve(name, allow_download)
