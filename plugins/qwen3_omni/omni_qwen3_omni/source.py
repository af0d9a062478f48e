"""Where Qwen3-Omni weights come from, checked without loading them (no torch here).

A model path is a preset (``tiny``: configs and tokenizer only, for
``load_format = "dummy"``), a local checkpoint directory, or a hub id
``owner/name`` (fetched by the shared Qwen downloader). ``omni config`` and
``omni plan`` call :func:`source_problems` so that a path the stages would
refuse fails before any process starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_qwen3_tts.source import ResolvedPath

PRESETS_DIR = Path(__file__).parent / "presets"
HUB_PATTERNS = ["*.json", "*.safetensors", "vocab.json", "merges.txt", "*.jinja"]
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def available_presets() -> list[str]:
    from omni_qwen3_tts.source import available_presets as listed

    return listed(PRESETS_DIR)


def _preset(name: str) -> str | None:
    preset = name.removeprefix("preset:")
    if (PRESETS_DIR / preset / "config.json").is_file() and not Path(name).exists():
        return preset
    return None


def resolve_model_path(name: str, allow_download: bool = True) -> ResolvedPath:
    """A preset of this plugin, a local directory, or a hub id (the shared Qwen resolver)."""
    from omni_qwen3_tts.source import resolve_model_path as resolve

    return resolve(
        name,
        allow_download,
        presets_dir=PRESETS_DIR,
        patterns=HUB_PATTERNS,
        family="Qwen3-Omni",
    )


Problem = tuple[tuple[tuple[str, ...], ...], str, str]


def source_problems(model_path: str, load_formats: Mapping[str, str]) -> list[Problem]:
    """What the stages would refuse in ``model_path``, as (config paths, message, fix).

    ``load_formats`` maps each weight-loading stage to its ``factory.load_format``.
    Hub ids are checked for their form, and against the local cache when downloads are
    off; :meth:`fetch_model_source` fetches them before any process starts.
    """
    real = [stage for stage, fmt in load_formats.items() if fmt != "dummy"]
    if _preset(model_path) is not None:
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
    fix = "point model_path at the directory a Qwen3-Omni release unpacks to"
    if local.is_dir():
        if not (local / "config.json").is_file():
            return [((("model_path",),), f"{model_path}: no config.json", fix)]
        if real and not any((local / name).is_file() for name in WEIGHT_FILES):
            return [
                (
                    (("model_path",), ("stages", stage, "factory", "load_format")),
                    f"{local}: no model.safetensors or model.safetensors.index.json, "
                    f"which stage {stage!r} loads",
                    f"{fix}, or --{stage}.factory.load_format dummy for random weights",
                )
                for stage in real
            ]
        return []
    if local.exists() or model_path.startswith((".", "/", "~")) or model_path.count("/") != 1:
        return [
            (
                (("model_path",),),
                f"model_path {model_path!r} is neither a directory, a preset "
                f"({', '.join(available_presets()) or 'none'}) nor a hub id of the form owner/name",
                "give a checkpoint directory, a hub id such as Qwen/Qwen3-Omni-30B-A3B-Instruct, "
                "or tiny with load_format dummy",
            )
        ]
    from omni_qwen3_tts.source import hub_id_problems

    return hub_id_problems(model_path, "Qwen/Qwen3-Omni-30B-A3B-Instruct")
