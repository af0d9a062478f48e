"""Prompt prefixes computed once: a newcomer's leading positions copied from a slot that holds them.

Why: the prompts one deployment serves share long heads (a TTS model's
instruction template, a chat's system prompt): MOSS-TTS's template is 141
positions of a ~200-position prompt, computed again for every request. SGLang
keeps such prefixes in a radix tree over its paged KV pool, on by default
(``engine.disable_radix_cache`` turns it off); our cache gives each sequence one
contiguous slot (:mod:`.kv_cache`), so the prefixes stay where they were
computed and cost no memory of their own:

* A prompt is cut into blocks of :data:`BLOCK` positions; block ``i``'s key is
  a hash chained over blocks ``0..i`` of the model's ``prefix_rows`` (what
  decides each position's keys and values: MOSS-TTS's 33 id channels), so one
  key means one whole prefix, at the same positions in every slot.
* A slot's prompt blocks are indexed once its prefill succeeded, and when
  its request finishes, the blocks of the answer it fed back too, where the
  model says what decided them (``generated_rows``: the thinker's next turn
  sends the answer back in its prompt). They stay
  valid while its sequence runs (decode writes past the prompt) and after the
  slot is freed, until the slot is handed to another request: freed slots are
  the cache.
* A newcomer's longest indexed prefix (never its last position, whose hidden
  state is the prefill's output) is copied into its slot -- nothing to copy
  when its own slot holds it, as it does for a client sending one template
  again and again -- and the model's prefill computes the rest from
  ``seq.cached``.

The reused keys were computed in another batch, so a hit equals a fresh
prefill within float rounding, not bit for bit (as SGLang's radix cache).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

#: Positions per hashed block: a hit reuses whole blocks only.
BLOCK = 16


def block_keys(rows: torch.Tensor, block: int = BLOCK) -> list[bytes]:
    """The chained key of each whole block of ``rows`` (``[positions, ...]``, one row each)."""
    data = rows.detach().to("cpu").contiguous()
    flat = data.reshape(data.shape[0], -1)
    raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    parent = f"{flat.dtype}:{tuple(flat.shape[1:])}".encode()
    keys = []
    for start in range(0, flat.shape[0] - block + 1, block):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(raw[start : start + block].numpy().tobytes())
        parent = digest.digest()
        keys.append(parent)
    return keys


def reusable(keys: list[bytes], length: int, block: int = BLOCK) -> list[bytes]:
    """The keys a prompt of ``length`` positions may take from the cache: its last
    position is always computed, because its hidden state is the prefill's output."""
    return keys[: max(length - 1, 0) // block]


def shared_blocks(a: list[bytes], b: list[bytes]) -> int:
    """Blocks two chains have in common (a chained key equal means all before it are)."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


class PrefixIndex:
    """Which slots hold which prompt blocks (keys chained from position 0)."""

    def __init__(self, block: int = BLOCK):
        self.block = block
        self._holders: dict[bytes, set[int]] = {}
        self._held: dict[int, list[bytes]] = {}

    def longest(self, keys: Iterable[bytes], prefer: int | None = None) -> tuple[int, int | None]:
        """(blocks, slot): the longest indexed prefix of ``keys`` and a slot holding it.

        ``prefer`` (the newcomer's own slot) wins a tie: reusing it copies nothing.
        """
        blocks, holders = 0, None
        for key in keys:
            found = self._holders.get(key)
            if not found:
                break
            blocks, holders = blocks + 1, found
        if holders is None:
            return 0, None
        return blocks, prefer if prefer in holders else min(holders)

    def held(self, slot: int) -> int:
        """Blocks ``slot`` holds."""
        return len(self._held.get(slot, ()))

    def register(self, slot: int, keys: list[bytes]) -> None:
        """``slot`` holds ``keys`` (its blocks ``0..len(keys)-1``), replacing what it held."""
        self.forget(slot)
        self._held[slot] = list(keys)
        for key in keys:
            self._holders.setdefault(key, set()).add(slot)

    def forget(self, slot: int) -> None:
        """``slot``'s positions are about to be overwritten: it holds nothing any more."""
        for key in self._held.pop(slot, ()):
            holders = self._holders.get(key)
            if holders is not None:
                holders.discard(slot)
                if not holders:
                    del self._holders[key]

    @property
    def blocks(self) -> int:
        """Distinct blocks indexed (for figures and tests)."""
        return len(self._holders)
