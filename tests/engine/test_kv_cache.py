"""The slot KV cache hands back what was written, as views where it can."""

from __future__ import annotations

import torch

from omni_core.engine.interface import CacheLayout
from omni_core.engine.kv_cache import SlotKVCache


def _filled_cache() -> SlotKVCache:
    layout = CacheLayout(
        num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu")
    )
    cache = SlotKVCache(layout, num_slots=4, slot_len=8)
    for slot in range(4):
        k = torch.full((1, 2, 5, 4), float(slot))
        cache.write(1, [slot], [0], k, -k)
    return cache


def test_consecutive_slots_read_back_as_views_of_the_cache() -> None:
    cache = _filled_cache()
    k, v = cache.read(1, [1, 2], 5)
    assert k.shape == (2, 2, 5, 4)
    assert k._base is cache.k and v._base is cache.v  # no copy
    assert torch.equal(k[:, 0, 0, 0], torch.tensor([1.0, 2.0]))
    assert torch.equal(v[:, 0, 0, 0], torch.tensor([-1.0, -2.0]))


def test_slots_out_of_order_read_back_the_same_values_as_copies() -> None:
    cache = _filled_cache()
    k, v = cache.read(1, [3, 0, 2], 5)
    assert k._base is None  # gathered
    assert torch.equal(k[:, 1, 4, 3], torch.tensor([3.0, 0.0, 2.0]))
    assert torch.equal(v[:, 1, 4, 3], torch.tensor([-3.0, -0.0, -2.0]))
    ordered_k, _ = cache.read(1, [2, 3], 5)
    assert torch.equal(ordered_k, k[[2, 0]])
