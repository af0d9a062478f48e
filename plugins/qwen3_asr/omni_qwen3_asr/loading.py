"""Building the ``asr`` stage's two parts and filling them with weights.

The release names every tensor under ``thinker.``: the audio tower under
``thinker.audio_tower.``, the decoder under ``thinker.model.`` and its head
``thinker.lm_head.`` (absent when the config ties it to the embeddings).
Both parts load strictly (the kit's :class:`Checkpoint`: a missing,
unexpected or misshapen tensor is named with its shard), and a tensor under
no known prefix is refused, so nothing in a checkpoint is silently ignored.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omni_core.engine.precision import torch_dtype
from omni_core.kit.weights import Checkpoint, CheckpointError
from omni_core.runtime.weight_share import share_weights
from omni_qwen3_omni.audio.encoder import AudioEncoder
from omni_qwen3_omni.loading import construct, part_seed
from omni_qwen3_omni.thinker.decoder import ThinkerLM
from omni_qwen3_tts.weights import dummy_fill

from .config import ASRConfig
from .source import resolve_model_path

LOAD_FORMATS = ("auto", "safetensors", "dummy")
TOWER, DECODER, HEAD = "thinker.audio_tower.", "thinker.model.", "thinker.lm_head."


@dataclass(frozen=True)
class ASRModel:
    """The audio tower, the decoder with its head, the config and where they came from."""

    encoder: AudioEncoder
    lm: ThinkerLM
    config: ASRConfig
    root: Path


def read_config(root: Path) -> ASRConfig:
    path = root / "config.json"
    try:
        return ASRConfig.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the model config ({exc})") from None


@functools.lru_cache(maxsize=4)
def load_model(
    model_path: str, load_format: str, dtype: str | None, device: str, seed: int = 0
) -> ASRModel:
    """Both parts of the checkpoint at ``model_path``, on ``device``, ready to run."""
    root, config = _source(model_path, load_format, "model", "load_format")
    if config.classify_num is not None:
        raise ValueError(
            f"model {model_path!r} is a Qwen3-ForcedAligner checkpoint, not Qwen3-ASR; "
            "it goes in stages.align.factory.aligner_path"
        )
    encoder, lm = _filled(root, config, load_format, dtype, device, seed)
    return ASRModel(encoder, lm, config, root)


def load_aligner(
    aligner_path: str, load_format: str, dtype: str | None, device: str, seed: int = 0
) -> tuple[AudioEncoder, ThinkerLM, ASRConfig, Path]:
    """A Qwen3-ForcedAligner checkpoint (or the ``tiny-aligner`` preset), ready to run."""
    root, config = _source(aligner_path, load_format, "aligner", "aligner_load_format")
    if config.classify_num is None:
        raise ValueError(
            f"aligner {aligner_path!r} is not a Qwen3-ForcedAligner checkpoint "
            "(its thinker_config.model_type does not name the forced aligner)"
        )
    encoder, lm = _filled(root, config, load_format, dtype, device, seed)
    return encoder, lm, config, root


def _source(path: str, load_format: str, what: str, setting: str) -> tuple[Path, ASRConfig]:
    """Where ``path`` is and its config; a preset (configs only) needs dummy weights."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"{setting} must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}")
    resolved = resolve_model_path(path)
    if resolved.preset and load_format != "dummy":
        raise ValueError(
            f"{what} {path!r} is the {resolved.preset!r} preset (configs only); "
            f'it needs {setting} = "dummy"'
        )
    return resolved.path, read_config(resolved.path)


def _filled(
    root: Path, config: ASRConfig, load_format: str, dtype: str | None, device: str, seed: int
) -> tuple[AudioEncoder, ThinkerLM]:
    target = torch.device(device)
    raw = json.loads((root / "config.json").read_text(encoding="utf-8"))
    encoder, lm = construct_parts(config, target, torch_dtype(dtype, target, config=raw))

    def fill(parts: torch.nn.ModuleDict) -> None:
        if load_format == "dummy":
            dummy_fill(parts["encoder"], part_seed(seed, "audio_encoder"))
            dummy_fill(parts["lm"], part_seed(seed, "thinker"))
        else:
            load_weights(Checkpoint.open(root), parts["encoder"], parts["lm"], config)

    # Filled here, or mapped from a weight-sharing leader (replicas on one device).
    key = f"qwen3-asr:{root}:{load_format}:{dtype}:{target.type}:{seed}"
    share_weights(key, torch.nn.ModuleDict({"encoder": encoder, "lm": lm}), fill)
    return encoder, lm


def construct_parts(
    config: ASRConfig, device: torch.device, dtype: torch.dtype
) -> tuple[AudioEncoder, ThinkerLM]:
    """The tower and the decoder on ``device``, parameters uninitialised, in ``dtype``."""
    encoder = construct(lambda: AudioEncoder(config.audio), device, dtype)
    return encoder, construct(lambda: _decoder(config), device, dtype)


def _decoder(config: ASRConfig) -> ThinkerLM:
    """The decoder and its head: the vocabulary's (ASR) or the aligner's classes."""
    lm = ThinkerLM(config.text)
    if config.classify_num is not None:
        lm.lm_head = torch.nn.Linear(config.text.hidden_size, config.classify_num, bias=False)
    return lm


def load_weights(checkpoint: Checkpoint, encoder: AudioEncoder, lm: ThinkerLM, config: Any) -> int:
    """Fill both parts from ``checkpoint``; return how many tensors were read."""
    known = (TOWER, DECODER, HEAD)
    orphans = sorted(n for n in checkpoint.weight_map if not n.startswith(known))
    if orphans:
        shown = ", ".join(orphans[:6]) + (
            f", ... ({len(orphans)} in all)" if len(orphans) > 6 else ""
        )
        raise CheckpointError(f"{checkpoint.directory}: tensor(s) Qwen3-ASR does not have: {shown}")
    count = checkpoint.load_into(encoder, (TOWER,), TOWER, "the audio tower")
    count += checkpoint.load_into(lm.model, (DECODER,), DECODER, "the decoder")
    if config.text.tie_word_embeddings and not checkpoint.names((HEAD,)):
        return count  # the head is the embedding table (tied in the model too)
    if config.text.tie_word_embeddings:
        raise CheckpointError(
            f"{checkpoint.directory}: the config ties lm_head to the embeddings, "
            "but the checkpoint holds thinker.lm_head.weight too"
        )
    return count + checkpoint.load_into(lm.lm_head, (HEAD,), HEAD + "", "the lm head")
