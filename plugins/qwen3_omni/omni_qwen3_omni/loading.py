"""Building each stage's part of Qwen3-Omni and filling it with weights.

A part (the audio tower, the vision tower, the thinker's decoder) is
constructed directly on its device with parameter initialisation switched
off: a real checkpoint overwrites every parameter, and ``dummy`` weights
are written by a seeded generator in name order, so initialising first
would only cost time (minutes for the real thinker). Buffers computed in
constructors (rotary tables, sinusoidal positions) are kept as built, in
float32; only parameters take the stage's dtype.

Parts are cached per process, so stages that share a process (the
text-only variant's single process) share one copy of each.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook

from omni_core.runtime.weight_share import share_weights

from .checkpoint import OWNERS, Checkpoint, check_coverage
from .config import ThinkerConfig
from .source import resolve_model_path

LOAD_FORMATS = ("auto", "safetensors", "dummy")
_RESETTABLE = (
    nn.Linear,
    nn.Embedding,
    nn.LayerNorm,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
)


@contextlib.contextmanager
def _no_parameter_init() -> Iterator[None]:
    saved = {cls: cls.reset_parameters for cls in _RESETTABLE}
    try:
        for cls in _RESETTABLE:
            cls.reset_parameters = lambda self: None  # type: ignore[method-assign]
        yield
    finally:
        for cls, method in saved.items():
            cls.reset_parameters = method  # type: ignore[method-assign]


@contextlib.contextmanager
def _parameters_in(dtype: torch.dtype) -> Iterator[None]:
    """Each floating parameter this thread registers is stored in ``dtype`` at once.

    Why: built in float32 and cast afterwards, the 30B-A3B thinker needs its
    float32 size (122 GB) on the device before the cast: the GPU check's
    build of it in bf16 ran out of an H200's 140 GiB. Cast as each layer
    registers it, the peak is the model in ``dtype`` plus one parameter.
    The hook is global to torch, so it answers only the thread that builds.
    """
    builder = threading.get_ident()

    def cast(module: nn.Module, name: str, param: nn.Parameter | None) -> nn.Parameter | None:
        if param is None or threading.get_ident() != builder:
            return None
        if not param.is_floating_point() or param.dtype == dtype:
            return None
        return nn.Parameter(param.detach().to(dtype), requires_grad=False)

    handle = register_module_parameter_registration_hook(cast)
    try:
        yield
    finally:
        handle.remove()


def construct(factory: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype):
    """``factory()`` on ``device`` with uninitialised parameters in ``dtype``, in eval mode."""
    with _no_parameter_init(), _parameters_in(dtype), torch.device(device):
        module = factory()
    for param in module.parameters():  # any set without registering (``param.data = ...``)
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
    # Mixtures' experts laid out stacked before they are filled (thinker/expert_stack.py):
    # loading by name fills the stacks, and a weight-sharing leader publishes them stacked.
    from .thinker.moe import stack_mixtures

    _, mixtures = stack_mixtures(module, copy=False)
    if mixtures and torch.device(device).type == "cuda":
        # the per-expert blocks just freed would stay reserved by torch's caching
        # allocator (a layer's experts, 1.2 GB in the 30B's bf16) and shrink the KV cache
        torch.cuda.empty_cache()
    return module.eval().requires_grad_(False)


def read_raw_config(root: Path) -> dict[str, Any]:
    path = root / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the model config ({exc})") from None


def read_config(root: Path) -> ThinkerConfig:
    return ThinkerConfig.from_dict(read_raw_config(root))


def _factory(part: str, raw: dict[str, Any]) -> Callable[[], nn.Module]:
    """How to build ``part`` from the root ``config.json`` (configs parsed, and checked, now)."""
    if part == "talker_ar":
        from .talker.config import TalkerConfig
        from .talker.model import Talker

        talker = TalkerConfig.from_dict(raw)
        return lambda: Talker(talker)
    if part == "code2wav":
        from .code2wav.config import Code2WavConfig
        from .code2wav.model import Code2Wav

        c2w = Code2WavConfig.from_dict(raw)
        return lambda: Code2Wav(c2w)
    config = ThinkerConfig.from_dict(raw)
    if part == "audio_encoder":
        from .audio.encoder import AudioEncoder

        return lambda: AudioEncoder(config.audio)
    if part == "image_encoder":
        from .vision.encoder import VisionEncoder

        return lambda: VisionEncoder(config.vision)
    if part == "thinker":
        from .thinker.decoder import ThinkerLM

        return lambda: ThinkerLM(config.text)
    raise ValueError(f"no model part {part!r}; known: {', '.join(OWNERS)}")


def part_seed(seed: int, part: str) -> int:
    """Dummy weights of one part depend on the seed and the part only, never on the split."""
    return (seed * 1_000_003 + zlib.crc32(part.encode())) % (2**63)


@functools.lru_cache(maxsize=8)
def load_part(
    model_path: str, part: str, load_format: str, dtype: str | None, device: str, seed: int = 0
) -> Any:
    """The ``part`` of the checkpoint at ``model_path`` (one of :data:`OWNERS`), ready to run."""
    from omni_core.engine.precision import torch_dtype
    from omni_qwen3_tts.weights import dummy_fill

    if load_format not in LOAD_FORMATS:
        raise ValueError(
            f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}"
        )
    resolved = resolve_model_path(model_path)
    if resolved.preset and load_format != "dummy":
        raise ValueError(
            f"model {model_path!r} is the {resolved.preset!r} preset (configs only); "
            'it needs load_format = "dummy"'
        )
    raw = read_raw_config(resolved.path)
    config = ThinkerConfig.from_dict(raw)
    target = torch.device(device)
    module = construct(_factory(part, raw), target, torch_dtype(dtype, target, config=raw))

    def fill(module: nn.Module) -> None:
        if load_format == "dummy":
            dummy_fill(module, part_seed(seed, part))
            return
        checkpoint = Checkpoint.open(resolved.path)
        check_coverage(checkpoint, [part])
        # The decoder's keys are model.* / lm_head.*; every other part's start below
        # its own prefix (thinker.audio_tower., thinker.visual., talker., code2wav.).
        strip = "thinker." if part == "thinker" else OWNERS[part][0]
        checkpoint.load_into(module, OWNERS[part], strip, f"stage {part!r}")

    # Filled here, or mapped from a weight-sharing leader (omni_core's seam).
    key = f"qwen3-omni:{resolved.path}:{part}:{load_format}:{dtype}:{target.type}:{seed}"
    share_weights(key, module, fill)
    return module, config, resolved.path
