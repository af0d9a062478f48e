"""State of a stateful streaming decode: every frame decoded once, equal to a one-pass decode.

Why it is exact: the decoder's only operations that look back in time are
its transformers' windowed attentions (the patch unfolds and the codebook
lookups act on one frame at a time). A query at position ``p`` attends to
positions ``p - window + 1 .. p``, so a chunk of ``n`` new positions needs
the keys/values of the ``window - 1`` positions before it plus its own:
``window - 1 + n`` in all. We carry exactly the newest ``window - 1``
(rotated keys, values) per layer between chunks.

The release's own chunked decode (``decode(..., chunk_duration=...)``)
differs: its ring cache holds only ``window`` entries, so writing a chunk's
``n`` positions overwrites keys that the chunk's earlier queries still
need, and its chunked output drifts from its one-pass output (by about
1.8e-3 relative L2 with the released weights and 8-second chunks; by several
percent on our tiny test config, whose window equals such a chunk). Ours
equals the one-pass decode within float rounding, for any chunking.

Memory stays bounded: per layer at most ``window - 1`` positions (fewer
while a stream is younger than its window), never the whole history. For
the release config in float32 that is about 170 MB per stream once every
window is full.

Concurrent streams are decoded as one batch. Each row has its own frame
count (:attr:`CodecStream.position`), from which every stage's absolute
positions follow; rows younger than the batch's longest carried history are
padded in front with zeros that the attention mask excludes (their positions
are negative). :meth:`CodecStream.stack` is therefore a (padded)
concatenation, :meth:`CodecStream.split` a slice and
:meth:`CodecStream.adopt` a hand-over.

Captured chunks (``graphs.py``) carry full windows instead: a stream they
decoded holds its windows as views of one tensor ``[B, n]``
(:attr:`CodecStream.flat`, laid out by :func:`window_views`), ``window - 1``
positions per layer whatever its age, a young stream's padded in front
with zeros at negative positions, which the mask excludes as it does a
batch's padding. Every path here reads that form as it reads its own.

The same streams usually come back together: a server's concurrent requests
advance chunk by chunk in step. Stacking the rows a :meth:`~CodecStream.split`
made, all of them and in order, hands back the state they were cut from
rather than copying every layer's keys and values into a new one (about
450 MB per call for 8 streams a few seconds in, at the release's size).
"""

from __future__ import annotations

import torch

from .transformer import KV

#: One decoder transformer's carried windows: (layers, heads, window - 1, head_dim).
WindowShape = tuple[int, int, int, int]


def window_width(shapes: list[WindowShape]) -> int:
    """Elements of one row's full windows, every layer's keys and values."""
    return sum(2 * layers * heads * length * dim for layers, heads, length, dim in shapes)


def window_views(flat: torch.Tensor, shapes: list[WindowShape]) -> list[list[KV]]:
    """Every layer's keys and values ``[B, heads, window - 1, head_dim]`` as views of the
    rows of ``flat`` ``[B, window_width(shapes)]``: one copy moves a row's whole state."""
    batch, offset = flat.shape[0], 0
    stages = []
    for layers, heads, length, dim in shapes:
        size = heads * length * dim
        layer_views = []
        for _ in range(layers):
            keys = flat[:, offset : offset + size].view(batch, heads, length, dim)
            values = flat[:, offset + size : offset + 2 * size].view(batch, heads, length, dim)
            layer_views.append((keys, values))
            offset += 2 * size
        stages.append(layer_views)
    if offset != flat.shape[1]:
        raise ValueError(f"windows of {offset} elements a row laid over rows of {flat.shape[1]}")
    return stages


def write_windows(target: torch.Tensor, stream: CodecStream, shapes: list[WindowShape]) -> None:
    """Write ``stream``'s full windows into ``target`` ``[B, window_width]``: its own
    :attr:`~CodecStream.flat`, or its carried positions behind zeros (a stream no
    captured chunk has decoded; all zeros before its first frame)."""
    if stream.flat is not None:
        target.copy_(stream.flat)
        return
    target.zero_()
    for stage, windows in zip(stream.kv, window_views(target, shapes), strict=True):
        for (keys, values), (key_window, value_window) in zip(stage, windows, strict=True):
            held = keys.shape[2]
            if held:
                key_window[:, :, key_window.shape[2] - held :].copy_(keys)
                value_window[:, :, value_window.shape[2] - held :].copy_(values)


class CodecStream:
    """Carried keys/values of every decoder attention layer, for ``batch`` rows.

    ``kv``: one entry per decoder transformer stage, each a list with one
    ``(keys, values)`` pair ``[B, heads, L, head_dim]`` per layer (``L`` is
    the same for the layers of a stage). ``position``: frames decoded so far
    per row, ``[B]`` long.
    """

    def __init__(self, batch: int, kv: list[list[KV]], position: torch.Tensor):
        self.batch = batch
        self.kv = kv
        self.position = position
        #: (the state this one's rows were split from, the first row there, that state's
        #: :attr:`version` then), while the rows are still those views: :meth:`stack` of
        #: all the parts returns that state, if it has not advanced since.
        self.cut_from: tuple[CodecStream, int, int] | None = None
        #: Decodes this state has taken in place (:meth:`advanced`).
        self.version = 0
        #: The tensor ``[batch, n]`` whose views :attr:`kv` are, when a captured chunk
        #: made them (full windows, :func:`window_views`); None otherwise.
        self.flat: torch.Tensor | None = None

    @classmethod
    def empty(
        cls,
        batch: int,
        shapes: list[tuple[int, int, int]],
        device: torch.device,
        dtype: torch.dtype,
    ) -> CodecStream:
        """A stream before its first frame; ``shapes``: (layers, heads, head_dim) per stage."""
        kv = [
            [
                (
                    torch.zeros(batch, heads, 0, head_dim, device=device, dtype=dtype),
                    torch.zeros(batch, heads, 0, head_dim, device=device, dtype=dtype),
                )
                for _ in range(layers)
            ]
            for layers, heads, head_dim in shapes
        ]
        return cls(batch, kv, torch.zeros(batch, dtype=torch.long, device=device))

    @classmethod
    def stack(cls, states: list[CodecStream]) -> CodecStream:
        """One state whose rows are the rows of ``states``, in order."""
        if len(states) == 1:
            return states[0]
        whole = _whole_of(states)
        if whole is not None:
            return whole
        stages = []
        for stage_states in zip(*(s.kv for s in states), strict=True):
            layers = []
            for layer_states in zip(*stage_states, strict=True):
                longest = max(k.shape[2] for k, _ in layer_states)
                keys = torch.cat([_pad_front(k, longest) for k, _ in layer_states])
                values = torch.cat([_pad_front(v, longest) for _, v in layer_states])
                layers.append((keys, values))
            stages.append(layers)
        position = torch.cat([s.position for s in states])
        return cls(sum(s.batch for s in states), stages, position)

    def split(self, sizes: list[int]) -> list[CodecStream]:
        """The inverse of :meth:`stack`: states of ``sizes`` rows each (views, no copy)."""
        if sum(sizes) != self.batch:
            raise ValueError(f"sizes {sizes} do not add up to the {self.batch} rows of the stream")
        if sizes == [self.batch]:
            return [self]
        parts = []
        start = 0
        for size in sizes:
            rows = slice(start, start + size)
            kv = [[(k[rows], v[rows]) for k, v in stage] for stage in self.kv]
            part = CodecStream(size, kv, self.position[rows])
            part.cut_from = (self, start, self.version)
            part.flat = None if self.flat is None else self.flat[rows]
            parts.append(part)
            start += size
        return parts

    def adopt(self, other: CodecStream) -> None:
        """Take ``other``'s contents (its rows of a batched decode) as this stream's own."""
        self.batch, self.kv, self.position = other.batch, other.kv, other.position
        self.cut_from, self.flat = other.cut_from, other.flat

    def advanced(self) -> None:
        """Mark the rows changed in place (a decode did): they are no longer a split's views,
        and the views split from them earlier are no longer its rows."""
        self.cut_from = self.flat = None
        self.version += 1

    def nbytes(self) -> int:
        """Bytes held by the carried keys/values."""
        return sum(k.nbytes + v.nbytes for stage in self.kv for k, v in stage)


def _whole_of(states: list[CodecStream]) -> CodecStream | None:
    """The state that ``states`` are, in order, every row of (as split), or None."""
    first = states[0].cut_from
    if first is None:
        return None
    whole, row = first[0], 0
    for state in states:
        if state.cut_from != (whole, row, whole.version):
            return None
        row += state.batch
    return whole if row == whole.batch else None


def _pad_front(x: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - x.shape[2]
    if not missing:
        return x
    return torch.cat((x.new_zeros(x.shape[0], x.shape[1], missing, x.shape[3]), x), dim=2)
