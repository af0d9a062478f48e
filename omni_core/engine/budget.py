"""How many KV-cache slots, of how many positions, an engine allocates.

The cache is allocated once, up front (no allocation per step), so its size is
decided here from the settings, before the first request: ``max_running_requests``
slots that split the token budget evenly. The token budget is
``engine.max_total_tokens`` unless ``engine.mem_fraction_static`` and the
device's memory are both known and ``max_total_tokens`` was not written: then
it is what the memory share leaves after the weights already loaded, as
SGLang sizes its pool. Pure arithmetic (no torch), so it is tested on any host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from .interface import CacheLayout, EngineSettings

# Bytes per element by dtype name: the one table both the engine (sizing its
# cache) and the planner (estimating memory, :mod:`omni_core.plan.estimates`) use.
DTYPE_BYTES: Mapping[str, float] = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "int4": 0.5,
}


#: The most requests a GPU engine stage runs together when the plan sizes
#: ``engine.max_running_requests`` from memory (:func:`memory_sized_slots`): as
#: SGLang's largest CUDA-graph batch on the biggest GPUs. A deploy file that wants
#: more writes the key.
MEMORY_SIZED_MAX_SLOTS = 256


@dataclass(frozen=True)
class SlotPlan:
    """The cache an engine allocates, and why it has that size (for logs and errors)."""

    num_slots: int
    slot_len: int
    source: str  # "max_total_tokens", "memory", or "memory, capped at max_position_embeddings"

    @property
    def total_tokens(self) -> int:
        return self.num_slots * self.slot_len


def dtype_bytes(dtype: object) -> float:
    """Bytes per element of a torch dtype (or its name), without importing torch.

    Names are matched case-insensitively, with or without ``torch.``; an
    unknown one is a ValueError (the planner turns it into a ConfigError).
    """
    size = getattr(dtype, "itemsize", None)  # torch >= 2.1 dtypes carry it
    if isinstance(size, int):
        return size
    name = str(dtype).lower().removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return DTYPE_BYTES[name]


def kv_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, dtype: object) -> int:
    """Cache bytes one position costs: keys and values of every layer, in ``dtype``."""
    return int(2 * layers * kv_heads * head_dim * dtype_bytes(dtype))


def bytes_per_token(layout: CacheLayout) -> int:
    """Cache bytes one position of ``layout`` costs (see :func:`kv_bytes_per_token`)."""
    return kv_bytes_per_token(
        layers=layout.num_layers,
        kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=layout.dtype,
    )


def plan_slots(
    settings: EngineSettings,
    layout: CacheLayout,
    *,
    device_memory: int | None = None,
    used_memory: int = 0,
) -> SlotPlan:
    """Slots and positions per slot for ``settings``.

    ``device_memory`` is the device's total memory in bytes (None on CPU or when
    unknown); ``used_memory`` what the process already holds there (weights).
    """
    slots = settings.max_running_requests
    total = settings.max_total_tokens
    source = "max_total_tokens"
    explicit = "max_total_tokens" in settings.model_fields_set
    if settings.mem_fraction_static is not None and device_memory and not explicit:
        budget = int(device_memory * settings.mem_fraction_static) - used_memory
        per_token = bytes_per_token(layout)
        if budget < per_token * slots:
            raise ConfigError(
                f"engine.mem_fraction_static = {settings.mem_fraction_static} of "
                f"{device_memory} bytes leaves {max(budget, 0)} bytes for the KV cache after "
                f"{used_memory} bytes already in use: not one position per running request "
                f"({per_token} bytes each)",
                hint="raise engine.mem_fraction_static, or set engine.max_total_tokens",
            )
        total, source = budget // per_token, "memory"
    slot_len = total // slots
    if source == "memory" and layout.max_positions and slot_len > layout.max_positions:
        # A slot longer than any sequence the model can take holds memory nobody can use,
        # and a CUDA graph's step reads its slot's whole span: Qwen3-ASR's decoder sized
        # from an H200's memory gave each slot 60,601 positions. The rest stays free.
        slot_len, source = layout.max_positions, "memory, capped at max_position_embeddings"
    if slot_len < 1:
        raise ConfigError(
            f"engine.max_total_tokens = {total} cannot give each of "
            f"engine.max_running_requests = {slots} slots one position",
            hint="raise engine.max_total_tokens or lower engine.max_running_requests",
        )
    return SlotPlan(num_slots=slots, slot_len=slot_len, source=source)


def memory_sized_slots(positions: int, max_positions: int | None, default: int) -> int:
    """``engine.max_running_requests`` for a GPU share that holds ``positions`` cache positions.

    Why: a slot never needs more than the model's ``max_position_embeddings``,
    and SGLang sizes its running requests from its memory pool; with the fixed
    default (8) a Qwen3-TTS 0.6B engine on 0.6 of an H200 kept 8 slots of
    32,768 positions and left two thirds of its cache free. So: as many
    requests of the model's full length as the share holds, never fewer than
    ``default`` (the settings' default, what the engine ran before; its slots
    are then shorter than the model's limit, as before) and never more than
    :data:`MEMORY_SIZED_MAX_SLOTS`. ``max_positions`` None (unknown): ``default``.
    """
    if not max_positions or max_positions < 1:
        return default
    return max(default, min(MEMORY_SIZED_MAX_SLOTS, positions // max_positions))
