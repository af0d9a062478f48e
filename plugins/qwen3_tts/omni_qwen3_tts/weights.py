"""Finding a checkpoint, reading its configs, and filling our modules with its tensors.

Loading is strict, by the kit's loader (:mod:`omni_core.kit.weights`, re-exported
here under the names this family's loaders use): every tensor of the checkpoint
must land in a parameter or buffer of the same name and shape, and every
parameter must be filled, or the error names what did not.

Modules are built on the ``meta`` device and materialised empty, so a real
checkpoint is not initialised twice; ``load_format="dummy"`` instead fills
every tensor from a seeded generator, in name order, from the config alone.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import nn

# The one dtype rule (auto: the checkpoint's where the device is fast), under the loaders' name.
from omni_core.engine.precision import checkpoint_dtype  # noqa: F401 - re-exported
from omni_core.engine.precision import torch_dtype as parse_dtype  # noqa: F401 - re-exported
from omni_core.kit.weights import (  # noqa: F401 - re-exported: the loaders' names for them
    CheckpointError,
    checkpoint_files,
    load_state,
    read_json,
)

from .source import (  # noqa: F401 - re-exported: the loaders' names for them
    HUB_PATTERNS,
    LOAD_FORMATS,
    PRESETS_DIR,
    ResolvedPath,
    available_presets,
    resolve_model_path,
)


def build_empty(factory: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype):
    """Construct on the meta device (no init cost), then allocate uninitialised storage.

    The dtype is set while still on meta, so storage is allocated once, in
    ``dtype``: cast after allocating, an 8B model in bf16 first took its
    float32 size (32 GB) on the device.
    """
    with torch.device("meta"), _initialisers_skipped():
        module = factory()
    # What Module.to_empty does, through torch.empty: its torch.empty_like of a meta tensor
    # runs torch's Python reference, which imports sympy (0.5 s of a stage's start).
    module = module.to(dtype)._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    reset_rope_buffers(module)
    return module.eval()


#: What modules' ``reset_parameters`` call; on meta tensors they compute nothing.
INITIALISERS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
)


@contextlib.contextmanager
def _initialisers_skipped() -> Iterator[None]:
    """``torch.nn.init``'s initialisers return their tensor untouched, while a model is
    built on the meta device.

    On meta they fill nothing, and some of them (``normal_``: every embedding) run
    torch's Python reference kernels there, whose first call imports dynamo: 1.1-1.4 s
    of CPU in every stage process that builds a model, against a start of 3 s.
    """
    saved = {name: getattr(nn.init, name) for name in INITIALISERS}
    try:
        for name in INITIALISERS:
            setattr(nn.init, name, _untouched)
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def _untouched(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor


def reset_rope_buffers(module: nn.Module) -> None:
    """Recompute non-persistent rotary tables, which ``to_empty`` leaves uninitialised."""
    from .layers import inv_frequencies

    for sub in module.modules():
        spec = getattr(sub, "rope_spec", None)
        if spec is not None:
            dim, theta = spec
            sub.inv_freq = inv_frequencies(dim, theta, device=sub.inv_freq.device)


def _fan_in(module: nn.Module, tensor: torch.Tensor) -> int:
    if isinstance(module, nn.ConvTranspose1d):
        return tensor.shape[0] * tensor.shape[2] // max(module.stride[0], 1)
    return max(tensor[0].numel(), 1)


#: From this many parameters on, a model on a CUDA device draws its dummy weights there.
DEVICE_DRAW_MIN_PARAMETERS = 1_000_000_000


def dummy_draw_device(module: nn.Module) -> torch.device:
    """Where :func:`dummy_fill` draws ``module``'s random numbers: the CPU, or its GPU.

    Why: the CPU's generator fills about 350 M values a second here (150 M
    before :func:`draw_normal` drew in chunks), so Qwen3-Omni's 35 B parameters
    take 100 s or more of the GPU check's 6-minute throughput phase; a GPU
    draws them in seconds.
    Drawn on the GPU, the values differ from the CPU's for the same seed, so
    models small enough to test with (the tiny presets, a few M parameters) stay
    on the CPU's generator: a tiny model on the GPU holds the weights it holds on
    the CPU, which is what lets ``tests/cuda`` compare the two.
    """
    first = next(module.parameters(), None)
    if first is None or first.device.type != "cuda":
        return torch.device("cpu")
    total = sum(p.numel() for p in module.parameters())
    return first.device if total >= DEVICE_DRAW_MIN_PARAMETERS else torch.device("cpu")


def dummy_fill(module: nn.Module, seed: int) -> None:
    """Seeded random weights chosen so that activations stay O(1) through every stage.

    Matrices get N(0, 1/fan_in), embeddings and codebooks N(0, 1), norms one,
    biases zero, residual scales 0.1, Snake parameters zero, EMA usage one.
    Tensors are visited in name order, so the result depends only on the
    config, the seed and where they are drawn (:func:`dummy_draw_device`).
    """
    draw = dummy_draw_device(module)
    gen = torch.Generator(device=draw).manual_seed(seed)
    owners: dict[str, nn.Module] = {}
    for mod_name, sub in module.named_modules():
        for p_name, _ in list(sub.named_parameters(recurse=False)) + list(
            sub.named_buffers(recurse=False)
        ):
            owners[f"{mod_name}.{p_name}" if mod_name else p_name] = sub
    state = module.state_dict()
    with torch.no_grad():
        for name in sorted(state):
            tensor = state[name]
            leaf = name.rsplit(".", 1)[-1]
            owner = owners.get(name)
            if not tensor.is_floating_point():
                tensor.zero_()
            elif leaf in ("cluster_usage", "initialized"):
                tensor.fill_(1.0)
            elif leaf in ("alpha", "beta", "bias"):
                tensor.zero_()
            elif leaf in ("scale", "gamma"):
                tensor.fill_(0.1)
            elif isinstance(owner, (nn.LayerNorm,)) or "norm" in _owner_name(name):
                tensor.fill_(1.0)
            elif isinstance(owner, nn.Embedding) or leaf in ("embedding_sum", "embed_sum"):
                draw_normal(tensor, gen, draw)
            else:
                std = _gain(name, tensor) / math.sqrt(
                    _fan_in(owner, tensor) if owner is not None else 1
                )
                draw_normal(tensor, gen, draw, std)


#: Values :func:`draw_normal` draws at a time on the CPU (a multiple of 16: see there).
DRAW_CHUNK = 1 << 20


def draw_normal(
    tensor: torch.Tensor, gen: torch.Generator, draw: torch.device, std: float | None = None
) -> None:
    """Fill ``tensor`` with ``torch.randn(tensor.shape, generator=gen) * std``, value for value.

    Why in chunks: one float32 draw of a whole weight, scaled, then cast, goes
    through memory three times; 4 MiB at a time stays in cache, 2.3x faster
    here (350 against 150 M values a second, 2 threads). The values are the
    same: torch's CPU normal draws in blocks of 16 and redraws a tensor's last
    16 when its size is not a multiple of 16, so chunks of a multiple of 16,
    with a last chunk of at least 16, draw exactly what one call would.
    """
    if draw.type != "cpu" or not tensor.is_contiguous():
        values = torch.randn(tensor.shape, generator=gen, device=draw)
        tensor.copy_(values if std is None else values * std)
        return
    flat = tensor.view(-1)
    total = flat.numel()
    scratch = torch.empty(min(total, DRAW_CHUNK + 15))
    start = 0
    while start < total:
        end = start + DRAW_CHUNK
        if total - end < 16:  # a short tail joins this chunk (see above)
            end = total
        part = scratch[: end - start]
        part.normal_(generator=gen)
        if std is not None:
            part.mul_(std)
        flat[start:end].copy_(part)
        start = end


def _owner_name(name: str) -> str:
    """The name of the module holding tensor ``name`` (empty for the root's own)."""
    return name.rsplit(".", 2)[-2] if "." in name else ""


def _gain(name: str, tensor: torch.Tensor) -> float:
    """Damp residual branches and the waveform head so dummy audio is not all clipping."""
    if name.endswith("conv2.conv.weight"):
        return 0.25
    if name.startswith("decoder.") and tensor.dim() == 3 and tensor.shape[0] == 1:
        return 0.05  # the waveform head (Qwen3-TTS's decoder.decoder.N, code2wav's decoder.N)
    return 1.0
