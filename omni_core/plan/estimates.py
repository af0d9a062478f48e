"""Memory estimates: the arithmetic model plugins share, and how the planner asks.

A model plugin knows its architectures; the core knows how transformer
weights and KV caches are sized. Plugins describe their stages with these
helpers in their own ``memory.py`` and answer the ``omni_estimate_memory``
hook. Everything here is arithmetic on numbers from a config: nothing loads a
checkpoint or imports torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ..engine.backends import engine_settings
from ..engine.budget import DTYPE_BYTES
from ..engine.budget import dtype_bytes as _engine_dtype_bytes
from ..engine.budget import kv_bytes_per_token as _engine_kv_bytes_per_token
from ..errors import ConfigError, PluginError
from .model import MemoryEstimate

GiB = 1024**3
MiB = 1024**2


def dtype_bytes(dtype: str, *, what: str = "dtype") -> float:
    """Bytes per element of ``dtype`` (``torch.`` prefix accepted; ``auto`` is bfloat16).

    The table is the engine's (:data:`omni_core.engine.budget.DTYPE_BYTES`),
    so an estimate sizes a dtype as the engine does.
    """
    return _engine_dtype_bytes(canonical_dtype(dtype, what=what))


def canonical_dtype(dtype: str, *, what: str = "dtype") -> str:
    """``dtype`` as a key of the engine's table: lower case, no ``torch.``, ``auto`` -> bfloat16."""
    key = str(dtype).lower().removeprefix("torch.")
    if key in ("auto", ""):
        key = "bfloat16"
    if key not in DTYPE_BYTES:
        raise ConfigError(
            f"{what}: unknown dtype {dtype!r}",
            hint=f"known dtypes: {', '.join(sorted(DTYPE_BYTES))}",
        )
    return key


def attention_params(hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """q, k, v and o projections (no biases; they are noise at this scale)."""
    return hidden * head_dim * (2 * heads + 2 * kv_heads)


def decoder_params(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int = 0,
    vocab: int = 0,
    tied_embeddings: bool = True,
    experts: int = 0,
    moe_intermediate: int = 0,
    shared_expert_intermediate: int = 0,
) -> int:
    """Parameters of a decoder-only transformer with SwiGLU MLPs (dense or MoE).

    A dense layer has one MLP of ``intermediate``; an MoE layer has
    ``experts`` MLPs of ``moe_intermediate``, a router, and optionally a
    shared expert. Norms are ignored (thousands of parameters among billions).
    """
    mlp = 3 * hidden * intermediate
    if experts:
        mlp = experts * 3 * hidden * moe_intermediate + hidden * experts
        mlp += 3 * hidden * shared_expert_intermediate
    per_layer = attention_params(hidden, heads, kv_heads, head_dim) + mlp
    embeddings = vocab * hidden * (1 if tied_embeddings else 2)
    return layers * per_layer + embeddings


def encoder_params(*, layers: int, hidden: int, intermediate: int) -> int:
    """A ViT/Whisper-style encoder: full attention plus a two-matrix MLP per layer."""
    return layers * (4 * hidden * hidden + 2 * hidden * intermediate)


def kv_bytes_per_token(
    *, layers: int, kv_heads: int, head_dim: int, dtype: str = "bfloat16"
) -> int:
    """Keys and values of one token across all layers, as the engine sizes its cache."""
    return _engine_kv_bytes_per_token(
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=canonical_dtype(dtype)
    )


def weights_bytes(params: int, dtype: str, *, what: str = "dtype") -> int:
    return int(params * dtype_bytes(dtype, what=what))


def engine_tokens(stage: Any) -> int:
    """The engine's KV budget in tokens: ``engine.max_total_tokens``, else the backend's default.

    The default is the one the stage's engine backend declares
    (:class:`~omni_core.engine.interface.EngineSettings`), read through the
    same torch-free validation the planner's checks use, so the estimate and
    the engine agree on it.
    """
    return int(engine_settings(stage).max_total_tokens)


def factory_dtype(stage: Any, default: str = "bfloat16") -> str:
    """The dtype a stage's factory loads in on a GPU (``factory.dtype``; ``auto``: ``default``).

    Estimates size GPU memory, and on a GPU ``auto`` is the checkpoint's dtype
    (:func:`omni_core.engine.precision.decide`): ``default`` is the release's.
    """
    value = getattr(stage.factory, "dtype", None)
    return default if value in (None, "", "auto") else str(value)


def engine_estimate(
    stage: Any,
    params: int,
    shape: Mapping[str, int],
    *,
    source: str,
    overhead_bytes: int,
    max_positions: int | None = None,
) -> MemoryEstimate:
    """The estimate of an engine stage: weights and KV cache in the stage's dtype.

    ``params`` are the weights the stage loads; ``shape`` is the architecture
    whose KV cache the engine keeps (``layers``, ``kv_heads``, ``head_dim``).
    The dtype is the stage's ``factory.dtype`` (the engine keeps its cache in
    the model's dtype), the token count :func:`engine_tokens`.
    ``max_positions``: the model's ``max_position_embeddings``, the longest a
    cache slot sized from memory is made (see :mod:`omni_core.plan.caches`).
    """
    dtype = factory_dtype(stage)
    tokens = engine_tokens(stage)
    per_token = kv_bytes_per_token(
        layers=shape["layers"], kv_heads=shape["kv_heads"], head_dim=shape["head_dim"], dtype=dtype
    )
    weights, label = weights_bytes(params, dtype), dtype
    quantization = getattr(stage.factory, "quantization", None)
    if quantization in ("int8", "w8a8_int8"):
        # int8 linear layers plus their per-channel scales; embeddings and heads are not
        # converted, but at release sizes they are a few percent: counted at 1 byte too
        acts = "per-row int8" if quantization == "w8a8_int8" else dtype
        weights, label = params, f"int8 weights, {acts} activations"
    elif getattr(stage.factory, "fp16_row_weights", False):
        # a float16 copy beside each blocked linear weight (omni_core.engine.cpu_row_copy);
        # embeddings keep none, but at release sizes they are a few percent: counted twice too
        weights, label = 2 * weights, f"{dtype} weights and their float16 row copies"
    return MemoryEstimate(
        weights,
        per_token * tokens,
        overhead_bytes,
        f"{source}, {label}, KV for {tokens} tokens",
        kv_bytes_per_token=per_token,
        max_positions=max_positions,
    )


def read_local_config(model_path: str, name: str = "config.json") -> dict[str, Any] | None:
    """The checkpoint's ``config.json`` when ``model_path`` is a local directory.

    A hub id (``Qwen/…``) or a missing file gives None: estimates then fall
    back to the known architectures. A file that is there but unreadable is a
    ConfigError naming it, since the deployment would fail on it later anyway.
    """
    if not model_path or not os.path.isdir(model_path):
        return None
    path = os.path.join(model_path, name)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model_path: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model_path: {path} is not a JSON object")
    return data


def collect_estimates(config: Any, plugins: Any) -> dict[str, MemoryEstimate]:
    """Ask the model plugins (``omni_estimate_memory``) for ``config``'s stages."""
    try:
        answer = plugins.pm.hook.omni_estimate_memory(pipeline=config)
    except ConfigError:
        raise
    except Exception as exc:
        raise PluginError(
            f"estimating the memory of pipeline {type(config).pipeline_name!r} failed: "
            f"{type(exc).__name__}: {exc}",
            hint="declare gpu_memory_fraction for the GPU stages, or use placement policy declared",
        ) from exc
    if answer is None:
        return {}
    names = set(config.stage_names)
    return {k: v for k, v in answer.items() if k in names and isinstance(v, MemoryEstimate)}


_HF_KEYS: Mapping[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "num_layers", "encoder_layers", "depth", "n_layers"),
    "hidden": ("hidden_size", "d_model", "embed_dim"),
    "heads": ("num_attention_heads", "encoder_attention_heads", "num_heads"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "intermediate": ("intermediate_size", "encoder_ffn_dim", "dim_feedforward"),
    "vocab": ("vocab_size",),
    "experts": ("num_experts", "num_local_experts"),
    "moe_intermediate": ("moe_intermediate_size",),
    "shared_expert_intermediate": ("shared_expert_intermediate_size",),
}


def shape_from_config(
    config: Mapping[str, Any] | None, fallback: Mapping[str, int]
) -> dict[str, int]:
    """An architecture's numbers from a Hugging Face config section, else ``fallback``.

    Only the keys of ``fallback`` are read, under their common spellings
    (``num_experts`` or ``num_local_experts`` …). ``head_dim`` defaults to
    ``hidden / heads`` when a config gives neither.
    """
    shape = dict(fallback)
    for key in fallback:
        for spelling in _HF_KEYS.get(key, (key,)):
            value = (config or {}).get(spelling)
            if isinstance(value, int) and not isinstance(value, bool):
                shape[key] = value
                break
    derive = config and "head_dim" in shape and "head_dim" not in config and "hidden" in shape
    if derive and any(s in config for s in _HF_KEYS["hidden"]):  # type: ignore[operator]
        shape["head_dim"] = shape["hidden"] // max(shape.get("heads", 1), 1)
    return shape
