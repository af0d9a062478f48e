"""A slot-based KV cache: one fixed-length slot per running sequence.

Continuous batching needs sequences of different lengths to step together.
Each sequence owns a slot of ``slot_len`` positions in preallocated tensors
``[layers, slots, kv_heads, slot_len, head_dim]``; a batched step writes each
sequence's new keys and values at its own positions and reads back the
slots of the batch, padded to the longest, with a mask for the padding. No
allocation happens per step, and freeing a sequence is just freeing its slot.
"""

from __future__ import annotations

import torch

from .interface import CacheLayout
from .sampling import from_host


class SlotKVCache:
    """``num_slots`` slots for sequences; with ``spare``, one more that no sequence gets.

    The spare slot takes the writes of a static-shape step's padding rows
    (:mod:`omni_core.engine.compiled`), so they never touch a sequence's keys.
    """

    def __init__(self, layout: CacheLayout, num_slots: int, slot_len: int, *, spare: bool = False):
        if num_slots < 1 or slot_len < 1:
            raise ValueError(f"a KV cache needs slots and positions, got {num_slots}x{slot_len}")
        self.layout, self.num_slots, self.slot_len = layout, num_slots, slot_len
        self.spare_slot: int | None = num_slots if spare else None
        rows = num_slots + (1 if spare else 0)
        shape = (layout.num_layers, rows, layout.num_kv_heads, slot_len, layout.head_dim)
        self.k = torch.zeros(shape, dtype=layout.dtype, device=layout.device)
        self.v = torch.zeros(shape, dtype=layout.dtype, device=layout.device)
        self.free: list[int] = list(range(num_slots - 1, -1, -1))

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def allocate(self) -> int:
        return self.free.pop()

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def write(
        self, layer: int, slots: list[int], starts: list[int], k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store ``k``/``v`` ``[B, kv_heads, T, head_dim]`` at positions ``start..start+T``.

        Rows may carry right padding (T is the longest new length in the batch);
        padded positions land beyond each sequence's length and are masked on read.
        """
        steps = k.shape[2]
        for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
            stop = min(start + steps, self.slot_len)
            if start >= self.slot_len:
                raise IndexError(f"slot {slot} is full ({self.slot_len} positions)")
            self.k[layer, slot, :, start:stop] = k[row, :, : stop - start]
            self.v[layer, slot, :, start:stop] = v[row, :, : stop - start]

    def read(self, layer: int, slots: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``slots`` at positions ``0..length`` (``[B, heads, length, dim]``).

        Consecutive ascending slots (a lone sequence, or a batch whose slots
        were handed out in order) come back as views of the cache, not
        copies: a copy per layer and step cost a talker step 3 ms at batch 1
        (Qwen3-TTS 0.6B, bf16, 28 layers). Callers only read them.
        """
        first = slots[0] if slots else 0
        if slots and slots == list(range(first, first + len(slots))):
            rows = slice(first, first + len(slots))
            return self.k[layer, rows, :, :length], self.v[layer, rows, :, :length]
        index = from_host(slots, self.k.device)
        return self.k[layer, index, :, :length], self.v[layer, index, :, :length]

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Positions ``0..length`` of every layer of slot ``source`` into slot ``target``
        (a prompt prefix another request computed, :mod:`.prefix_cache`)."""
        self.k[:, target, :, :length] = self.k[:, source, :, :length]
        self.v[:, target, :, :length] = self.v[:, source, :, :length]

    def clear(self, slot: int) -> None:
        self.k[:, slot].zero_()
        self.v[:, slot].zero_()
