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

from omni_qwen3_tts.source import (
    ResolvedPath,
    available_presets,
    download,
    hub_id_problems,
    resolve_model_path,
)

PRESETS_DIR = Path(__file__).parent / "presets"
DEFAULT_CODEC = "OpenMOSS-Team/MOSS-Audio-Tokenizer"
FAMILY = "MOSS-TTS"
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "vocab.json", "merges.txt", "*.txt"]
CODEC_PATTERNS = ["*.json", "*.safetensors"]
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")

SourceProblem = tuple[tuple[tuple[str, ...], ...], str, str]


def resolve_model(name: str, allow_download: bool = True) -> ResolvedPath:
    return resolve_model_path(
        name,
        allow_download,
        presets_dir=PRESETS_DIR,
        patterns=MODEL_PATTERNS,
        family=FAMILY,
    )


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
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
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


def source_problems(
    model_path: str, load_formats: Mapping[str, str], codec_paths: Mapping[str, str | None]
) -> list[SourceProblem]:
    """What the stages would refuse about the model and codec paths, as (paths, message, fix)."""
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
        return _directory_problems(local, model_path, real, codec_paths)
    if local.exists() or model_path.startswith((".", "/", "~")) or model_path.count("/") != 1:
        return [
            (
                (("model_path",),),
                f"model_path {model_path!r} is neither a directory, a preset "
                f"({', '.join(available_presets(PRESETS_DIR))}) nor a hub id owner/name",
                "give a MOSS-TTS checkpoint directory, a hub id such as OpenMOSS-Team/MOSS-TTS, "
                "or tiny with load_format dummy",
            )
        ]
    return hub_id_problems(model_path, "OpenMOSS-Team/MOSS-TTS")


def _directory_problems(
    local: Path, model_path: str, real: list[str], codec_paths: Mapping[str, str | None]
) -> list[SourceProblem]:
    if not (local / "config.json").is_file():
        return [
            (
                (("model_path",),),
                f"{model_path}: not a MOSS-TTS checkpoint (no config.json)",
                "point model_path at the directory the release unpacks to",
            )
        ]
    problems: list[SourceProblem] = []
    for stage in real:
        if stage == "tts_engine" and not any((local / f).is_file() for f in WEIGHT_FILES):
            problems.append(
                (
                    (("model_path",), ("stages", stage, "factory", "load_format")),
                    f"{local}: no model.safetensors or model.safetensors.index.json, "
                    f"which stage {stage!r} loads",
                    f"--{stage}.factory.load_format dummy for random weights",
                )
            )
        if stage in codec_paths:
            problems += _codec_problems(local, stage, codec_paths[stage])
    return problems


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
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        return [
            (
                where,
                f"codec {name!r} (from {origin}) is neither a directory nor a hub id owner/name",
                f"--{stage}.factory.codec_path DIR with the MOSS-Audio-Tokenizer checkpoint",
            )
        ]
    return []  # a hub id: looked up when the stage loads (that needs the network)
