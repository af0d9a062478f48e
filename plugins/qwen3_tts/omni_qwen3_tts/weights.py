"""Finding a checkpoint, reading its configs, and filling our modules with its tensors.

Loading is strict by design: every tensor of the checkpoint must land in a
parameter or buffer of the same name and shape, and every parameter must be
filled. A missing, unexpected or wrongly-shaped tensor is an error that names
it (and the file it came from), because a silently skipped tensor produces a
model that runs and talks nonsense.

Modules are built on the ``meta`` device and materialised empty, so a real
checkpoint is not initialised twice; ``load_format="dummy"`` instead fills
every tensor from a seeded generator, in name order, from the config alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .source import (  # noqa: F401 - re-exported: the loaders' names for them
    HUB_PATTERNS,
    LOAD_FORMATS,
    PRESETS_DIR,
    ResolvedPath,
    available_presets,
    resolve_model_path,
)


class CheckpointError(ValueError):
    """A checkpoint that does not match the architecture its config describes."""


def read_json(path: Path, required: bool = True) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} is missing")
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc


def checkpoint_files(directory: Path, stem: str = "model") -> list[Path]:
    """The safetensors files of ``directory``: a single file, or the shards of an index."""
    index = directory / f"{stem}.safetensors.index.json"
    single = directory / f"{stem}.safetensors"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no weight_map")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(f"{index}: shard file(s) missing: {', '.join(missing)}")
        _check_index(directory, weight_map)
        return [directory / s for s in shards]
    if single.is_file():
        return [single]
    raise CheckpointError(
        f"{directory}: no {stem}.safetensors or {stem}.safetensors.index.json "
        "(use load_format='dummy' to run without weights)"
    )


def _check_index(directory: Path, weight_map: dict[str, str]) -> None:
    from safetensors import safe_open

    by_shard: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        by_shard.setdefault(shard, set()).add(name)
    for shard, names in by_shard.items():
        with safe_open(str(directory / shard), framework="pt") as handle:
            present = set(handle.keys())
        absent = sorted(names - present)
        if absent:
            raise CheckpointError(
                f"{directory / shard}: the index places tensor {absent[0]!r} here but the shard "
                f"does not contain it ({len(absent)} such tensor(s))"
            )


def _describe(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def load_state(module: nn.Module, files: Iterable[Path], what: str) -> None:
    """Copy every tensor of ``files`` into ``module`` by name; refuse any mismatch."""
    from safetensors import safe_open

    expected = module.state_dict()
    filled: set[str] = set()
    unexpected: list[str] = []
    wrong: list[str] = []
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if name not in expected:
                        unexpected.append(f"{name} (in {file.name})")
                        continue
                    if name in filled:
                        raise CheckpointError(f"{what}: tensor {name!r} appears twice ({file})")
                    target = expected[name]
                    shape = tuple(handle.get_slice(name).get_shape())
                    if shape != tuple(target.shape):
                        wrong.append(f"{name}: checkpoint {shape}, model {tuple(target.shape)}")
                        continue
                    target.copy_(handle.get_tensor(name))
                    filled.add(name)
    missing = sorted(set(expected) - filled)
    problems = []
    if unexpected:
        problems.append(f"unexpected tensor(s) {_describe(sorted(unexpected))}")
    if wrong:
        problems.append(f"wrong shape for {_describe(wrong)}")
    if missing:
        problems.append(f"missing tensor(s) {_describe(missing)}")
    if problems:
        raise CheckpointError(
            f"{what}: the checkpoint does not match the architecture of its config: "
            + "; ".join(problems)
        )


def build_empty(factory: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype):
    """Construct on the meta device (no init cost), then allocate uninitialised storage."""
    with torch.device("meta"):
        module = factory()
    module = module.to_empty(device=device)
    module = module.to(dtype)
    reset_rope_buffers(module)
    return module.eval()


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


def dummy_fill(module: nn.Module, seed: int) -> None:
    """Seeded random weights chosen so that activations stay O(1) through every stage.

    Matrices get N(0, 1/fan_in), embeddings and codebooks N(0, 1), norms one,
    biases zero, residual scales 0.1, Snake parameters zero, EMA usage one.
    Tensors are visited in name order, so the result depends only on the
    config and the seed.
    """
    gen = torch.Generator().manual_seed(seed)
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
            elif isinstance(owner, (nn.LayerNorm,)) or "norm" in name.rsplit(".", 2)[-2]:
                tensor.fill_(1.0)
            elif isinstance(owner, nn.Embedding) or leaf in ("embedding_sum", "embed_sum"):
                tensor.copy_(torch.randn(tensor.shape, generator=gen))
            else:
                std = _gain(name, tensor) / math.sqrt(
                    _fan_in(owner, tensor) if owner is not None else 1
                )
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * std)


def _gain(name: str, tensor: torch.Tensor) -> float:
    """Damp residual branches and the waveform head so dummy audio is not all clipping."""
    if name.endswith("conv2.conv.weight"):
        return 0.25
    if name.startswith("decoder.") and tensor.dim() == 3 and tensor.shape[0] == 1:
        return 0.05  # the waveform head (Qwen3-TTS's decoder.decoder.N, code2wav's decoder.N)
    return 1.0


def parse_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(table)}")
    return table[dtype]
