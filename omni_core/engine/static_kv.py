"""A KV store with static shapes, for compiled and captured decode steps.

The eager step reads each batch's slots only up to the longest sequence, so
its shapes change every step; a compiled (or CUDA-graph) step must see the
same shapes every time. This store writes the new keys and values at each
row's own cache position (one ``index_put_``, no Python loop) and returns the
rows' slots up to a fixed span (their capacity, or a shorter span that holds
every row: ``compiled.attention_spans``); :func:`static_mask` hides every key
past the row's position. Masked keys add exactly zero to the softmax, so the
result equals the eager step's within float rounding.

The cache tensors are arguments, not attributes read at trace time, so one
compiled graph serves every step, and a CUDA graph replays over the same
storage. Padding rows of a bucket point at a spare slot no sequence owns.
"""

from __future__ import annotations

import torch


class StaticSlotStore:
    """``update(layer, k, v)`` over ``k_cache``/``v_cache`` ``[layers, slots, heads, L, dim]``.

    ``slots`` ``[B]``: each row's slot; ``positions`` ``[B, T]``: the cache
    position of each new key (T new keys per row, usually one). ``span``:
    how much of each slot attention reads (the first ``span`` positions;
    default all ``L``), which must hold every row's positions.
    """

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        span: int | None = None,
        regions: bool = False,
    ):
        self.k, self.v = k_cache, v_cache
        self.span = k_cache.shape[3] if span is None else span
        #: whether a compiled step runs each layer as one shared region (:mod:`.layer_regions`)
        self.regions = regions
        self.slots = slots
        self.rows = slots[:, None].expand_as(positions)
        self.positions = positions
        heads = torch.arange(k_cache.shape[2], device=k_cache.device)
        # Index tensors for every dimension but the last, broadcast to [B, T, heads]: one
        # index_put_ on the cache tensor itself, which inductor keeps in place (a write
        # through a view of it, k_cache[layer][...] = ..., made it copy the whole cache).
        self._where = (self.rows[..., None], heads[None, None, :], positions[..., None])

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k``/``v`` ``[B, heads, T, dim]``; return the slots ``[B, heads, span, dim]``."""
        where = (torch.full_like(self._where[0], layer), *self._where)
        self.k.index_put_(where, k.transpose(1, 2))
        self.v.index_put_(where, v.transpose(1, 2))
        return read_span(self.k[layer], self.slots, self.span), read_span(
            self.v[layer], self.slots, self.span
        )

    def layer_inputs(self, layer: int) -> tuple[torch.Tensor, ...]:
        """What a :class:`LayerSlotStore` for ``layer`` is made of, every one a tensor."""
        layer_id = torch.full((1,), layer, dtype=torch.long, device=self.k.device)
        return self.k, self.v, layer_id, self.slots, self.positions


class LayerSlotStore:
    """:class:`StaticSlotStore`'s update for one layer named by a tensor, not a number.

    So that one traced layer serves every layer of a stack
    (:mod:`.layer_regions`): the same writes and reads, with the layer index
    an input of the graph. ``update`` ignores the number it is given. The
    whole cache, not the layer's view of it: inductor copies a cache it
    writes through a view.
    """

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        layer_id: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        span: int,
    ):
        self.k, self.v, self.span, self.slots = k_cache, v_cache, span, slots
        batch, steps = positions.shape
        heads = torch.arange(k_cache.shape[2], device=k_cache.device)
        self._where = (
            layer_id.view(1, 1, 1).expand(batch, steps, 1),
            slots.view(batch, 1, 1).expand(batch, steps, 1),
            heads[None, None, :],
            positions[..., None],
        )
        # the rows of the cache seen as [layers * slots, ...], which read_span reads
        self._rows = layer_id * k_cache.shape[1] + slots

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k``/``v`` ``[B, heads, T, dim]``; return the slots ``[B, heads, span, dim]``."""
        self.k.index_put_(self._where, k.transpose(1, 2))
        self.v.index_put_(self._where, v.transpose(1, 2))
        rows, span = self._rows, self.span
        return read_span(self.k.flatten(0, 1), rows, span), read_span(
            self.v.flatten(0, 1), rows, span
        )


def read_span(cache: torch.Tensor, rows: torch.Tensor, span: int) -> torch.Tensor:
    """``cache[rows, :, :span]`` (``cache`` ``[R, heads, L, dim]``): ``[B, heads, span, dim]``.

    Traced (a compiled step), one gather over row, head and position: a slice of
    the cache is contiguous only when the span is the whole slot, and inductor
    guards on that layout, so a step whose span is a dynamic size built a
    second graph for the whole slot. Eagerly the slice and ``index_select``,
    the same values: the gather's ``aten.index`` took six times as long on the
    CPU (a Qwen3-TTS talker layer's 8 rows of 512 positions: 653 against 108
    us; compiled, 114 against 108).
    """
    if not torch.compiler.is_compiling():
        return cache[:, :, :span].index_select(0, rows)
    device = rows.device
    where = (
        rows[:, None, None],
        torch.arange(cache.shape[1], device=device)[None, :, None],
        torch.arange(span, device=device)[None, None, :],
    )
    return cache[where]


def static_mask(positions: torch.Tensor, capacity: int) -> torch.Tensor:
    """Boolean ``[B, 1, T, capacity]``: query at ``positions[b, t]`` sees keys ``0..that``.

    The same keys the eager causal mask lets a decoding row see (its cached
    prefix and itself); stale contents of the slot past the row are hidden.
    """
    return key_mask(positions, torch.arange(capacity, device=positions.device))


def key_mask(positions: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """:func:`static_mask` over the key positions ``keys`` (``arange(span)``), whose size a
    compiled step takes as dynamic (``compiled.StaticDecoder``)."""
    return (keys[None, None, :] <= positions[:, :, None])[:, None]
