"""Where MOSS-TTS weights come from: the model checkpoint and its separate codec checkpoint.

Torch-free, so the parent process can refuse a path before any stage starts.
The model path is a preset (``tiny``: configs and tokenizer only, for
``load_format = "dummy"``), a checkpoint directory or a hub id. The codec
("MOSS-Audio-Tokenizer") is a checkpoint of its own, located in this order:

1. ``factory.codec_path`` of the stage, when set;
2. the model's ``processor_config.json`` (``audio_tokenizer_name_or_path``,
   top level or under ``audio_tokenizer``), as the release's processor reads
   it; a relative path is taken relative to the model directory first (our
   preset ships its codec config that way);
3. the release's default hub id, ``OpenMOSS-Team/MOSS-Audio-Tokenizer``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omni_core.kit.source import (
    HUB_FILES,
    WEIGHT_FILES,
    ModelSource,
    ResolvedPath,
    SourceProblem,
    download,
    looks_like_hub_id,
)

PRESETS_DIR = Path(__file__).parent / "presets"
DEFAULT_CODEC = "OpenMOSS-Team/MOSS-Audio-Tokenizer"
MODEL_PATTERNS = [*HUB_FILES, "*.txt"]
CODEC_PATTERNS = ["*.json", "*.safetensors"]


class MossSource(ModelSource):
    """The kit's checks for the model, and for the codec checkpoint each stage names."""

    def directory_problems(
        self, local: Path, real: list[str], factories: Mapping[str, Any]
    ) -> list[SourceProblem]:
        problems = super().directory_problems(local, real, factories)
        for stage in real:
            if hasattr(factories.get(stage), "codec_path"):
                problems += _codec_problems(local, stage, factories[stage].codec_path)
        return problems


SOURCE = MossSource(
    family="MOSS-TTS",
    presets_dir=PRESETS_DIR,
    example="OpenMOSS-Team/MOSS-TTS",
    hub_patterns=MODEL_PATTERNS,
    weights={"tts_engine": ""},
    layout="config.json, model.safetensors, processor_config.json",
)


def resolve_model(name: str, allow_download: bool = True) -> ResolvedPath:
    return SOURCE.resolve(name, allow_download)


def codec_reference(model_root: Path, codec_path: str | None = None) -> tuple[str, str]:
    """The codec's location as written (before resolving) and where that came from."""
    if codec_path:
        return codec_path, "factory.codec_path"
    config = model_root / "processor_config.json"
    if config.is_file():
        try:
            raw = json.loads(config.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{config}: invalid JSON ({exc})") from exc
        nested = raw.get("audio_tokenizer")
        name = (
            nested.get("audio_tokenizer_name_or_path") if isinstance(nested, dict) else None
        ) or (raw.get("audio_tokenizer_name_or_path"))
        if isinstance(name, str) and name:
            return name, str(config)
    return DEFAULT_CODEC, "the release's default codec"


def resolve_codec(
    model_root: Path, codec_path: str | None = None, allow_download: bool = True
) -> Path:
    """The codec checkpoint directory (``config.json`` + weights), or a clear error."""
    name, origin = codec_reference(model_root, codec_path)
    for candidate in (model_root / name, Path(name).expanduser()):
        if candidate.is_dir():
            if not (candidate / "config.json").is_file():
                raise FileNotFoundError(
                    f"codec {name!r} (from {origin}) is {candidate}, which has no config.json"
                )
            return candidate
    if not looks_like_hub_id(name):
        raise FileNotFoundError(
            f"codec {name!r} (from {origin}) is neither a directory nor a hub id owner/name; "
            "set factory.codec_path to the MOSS-Audio-Tokenizer checkpoint directory"
        )
    if not allow_download:
        raise FileNotFoundError(
            f"codec {name!r} (from {origin}) is not local and downloads are off"
        )
    try:
        return download(name, CODEC_PATTERNS)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{exc} (the codec was named by {origin}; set factory.codec_path to a local copy)"
        ) from None


def _codec_problems(local: Path, stage: str, codec_path: str | None) -> list[SourceProblem]:
    where = (("stages", stage, "factory", "codec_path"),)
    try:
        name, origin = codec_reference(local, codec_path)
    except ValueError as exc:
        return [(where, str(exc), "fix processor_config.json or set factory.codec_path")]
    for candidate in (local / name, Path(name).expanduser()):
        if candidate.is_dir():
            if not any((candidate / f).is_file() for f in WEIGHT_FILES):
                return [
                    (
                        where,
                        f"codec directory {candidate} (from {origin}) has no model.safetensors, "
                        f"which stage {stage!r} loads",
                        f"--{stage}.factory.codec_path DIR with the MOSS-Audio-Tokenizer weights",
                    )
                ]
            return []
    if not looks_like_hub_id(name):
        return [
            (
                where,
                f"codec {name!r} (from {origin}) is neither a directory nor a hub id owner/name",
                f"--{stage}.factory.codec_path DIR with the MOSS-Audio-Tokenizer checkpoint",
            )
        ]
    return []  # a hub id: looked up when the stage loads (that needs the network)
