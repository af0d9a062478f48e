"""State of a streaming codec decode: each frame decoded once, exactly as a full decode.

Why: the release streams by re-decoding 25 frames of left context with every
chunk. That costs about three times the codec work of one full decode at its
chunk size, and it is only an approximation (the sliding-window transformer
alone looks back 8 x 71 frames). Every operation of the decoder is causal, so
carrying each one's look-back from chunk to chunk — the last inputs of every
causal convolution, the last input of every overlapping transposed
convolution, the transformer's keys and values inside its window — gives the
full decode's samples while computing every frame once.

Streams of concurrent requests can be decoded as one batch: every tensor of
a state has a fixed shape per row (convolution tails start as the zeros the
full decode pads with; the key/value window is always ``window - 1`` long,
with a per-row count of valid entries), so :meth:`StreamState.stack` is a
concatenation and :meth:`StreamState.split` a slice.

Lead (Qwen3-Omni's code2wav only): its transposed convolutions trim their
overhang on the left too, so the full decode of ``F`` frames is shorter than
``F`` frames' worth of samples and each of those layers looks one input
ahead. A stream instead keeps every layer at a whole number of outputs per
input: a row's first chunk then starts with *lead* samples that the full
decode does not have. While a chunk is decoded the state knows, per row and
at the current layer's rate, how many samples lead (:attr:`StreamState.lead`),
zeroes them before every operation with look-back (exactly the full decode's
zero padding there) and the decoder crops them from the audio. Rows that
continue a stream have no lead, so rows at different stages still batch.
"""

from __future__ import annotations

import torch
from torch import nn


class StreamState:
    """Look-back of one decoder for ``batch`` rows that advance together.

    ``tails``: per streaming convolution, its last inputs ``[B, C, n]``
    (created as zeros on first use). ``keys``/``values``: per transformer
    layer ``[B, kv_heads, window - 1, head_dim]``, newest last, already
    rotated. ``valid``: how many of those window entries are real (the rest
    are before the stream's start). ``position``: frames decoded so far.
    """

    def __init__(
        self,
        batch: int,
        layers: int,
        kv_heads: int,
        window: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.batch = batch
        self.tails: dict[nn.Module, torch.Tensor] = {}
        shape = (batch, kv_heads, max(window - 1, 0), head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.valid = torch.zeros(batch, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, dtype=torch.long, device=device)
        #: Per row, on the host: no frame decoded yet (``position == 0`` without reading
        #: the device, which would wait for it, and which a CUDA graph cannot capture).
        self.fresh = [True] * batch
        self._clear_lead()

    # -- lead of rows that start in this chunk (left-trimmed transposed convs) -----

    def _clear_lead(self) -> None:
        # Both live only while one chunk is decoded: ``starting`` (long, 1 for
        # the rows whose first chunk this is) while some row starts, ``lead``
        # once a left-trimming layer has run.
        self.starting: torch.Tensor | None = None
        self.lead: torch.Tensor | None = None

    def begin_chunk(self, track_lead: bool, every_row: bool = False) -> list[bool] | None:
        """Start decoding a chunk; with ``track_lead``, which rows start their streams with it.

        ``track_lead``: the decoder has left-trimmed layers. Then, if a row
        starts, :attr:`lead` is kept up to date through the chunk. Call
        before anything advances :attr:`position`. Without ``track_lead``
        returns ``None``. Nothing is read from the device either way.
        ``every_row``: track the lead on the device whichever rows start
        (a captured chunk, whose rows change from replay to replay; a row
        that continues its stream then has a lead of 0, which changes none
        of its samples).
        """
        self._clear_lead()
        if not track_lead:
            return None
        flags = list(self.fresh)
        if every_row or any(flags):
            self.starting = (self.position == 0).long()
        return flags

    def upsample_lead(self, stride: int, left_trim: int) -> None:
        """A transposed convolution ran: lead is now at its output rate."""
        if self.starting is None or (self.lead is None and left_trim == 0):
            return
        lead = self.starting * left_trim
        self.lead = lead if self.lead is None else self.lead * stride + lead

    def zero_lead(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[B, C, n]`` with each row's leading samples zeroed (no copy without lead)."""
        if self.lead is None:
            return x
        keep = torch.arange(x.shape[-1], device=x.device)[None, :] >= self.lead[:, None]
        return x * keep[:, None, :].to(x.dtype)

    def end_chunk(self) -> None:
        """Finish a chunk: the lead belongs to that chunk only."""
        self._clear_lead()

    # -- convolutions -------------------------------------------------------------

    def tail(self, module: nn.Module, x: torch.Tensor, length: int) -> torch.Tensor:
        """The last ``length`` inputs ``module`` saw; zeros (its padding) before any."""
        tail = self.tails.get(module)
        if tail is None:
            tail = x.new_zeros(x.shape[0], x.shape[1], length)
        return tail

    def keep_tail(self, module: nn.Module, joined: torch.Tensor, length: int) -> None:
        # A copy, so the state does not pin the whole chunk's activation in memory.
        self.tails[module] = joined[..., joined.shape[-1] - length :].clone()

    # -- as a flat list of tensors (a captured chunk's inputs and outputs) -------------

    def tensors(self, tails: list[nn.Module]) -> list[torch.Tensor]:
        """Every tensor of the state, in a fixed order: ``tails``' (which must all be
        present), the keys and values per layer, ``valid``, ``position``."""
        return [
            *(self.tails[m] for m in tails),
            *self.keys,
            *self.values,
            self.valid,
            self.position,
        ]

    @classmethod
    def from_tensors(
        cls, tails: list[nn.Module], tensors: list[torch.Tensor], fresh: list[bool]
    ) -> StreamState:
        """The inverse of :meth:`tensors`; ``fresh``: which rows have decoded nothing yet."""
        layers = (len(tensors) - len(tails) - 2) // 2
        out = cls.__new__(cls)
        out.batch = int(tensors[-1].shape[0])
        out.tails = dict(zip(tails, tensors[: len(tails)], strict=True))
        out.keys = list(tensors[len(tails) : len(tails) + layers])
        out.values = list(tensors[len(tails) + layers : len(tails) + 2 * layers])
        out.valid, out.position = tensors[-2], tensors[-1]
        out.fresh = list(fresh)
        out._clear_lead()
        return out

    # -- batching of concurrent streams -------------------------------------------

    @classmethod
    def stack(cls, states: list[StreamState]) -> StreamState:
        """One state whose rows are the rows of ``states``, in order."""
        if len(states) == 1:
            return states[0]
        out = cls.__new__(cls)
        out.batch = sum(s.batch for s in states)
        out.keys = [torch.cat(layer) for layer in zip(*(s.keys for s in states), strict=True)]
        out.values = [torch.cat(layer) for layer in zip(*(s.values for s in states), strict=True)]
        out.valid = torch.cat([s.valid for s in states])
        out.position = torch.cat([s.position for s in states])
        out.fresh = [f for s in states for f in s.fresh]
        out._clear_lead()
        out.tails = {}
        for module in {m: None for s in states for m in s.tails}:
            like = next(s.tails[module] for s in states if module in s.tails)
            out.tails[module] = torch.cat(
                [s.tails.get(module, like.new_zeros(s.batch, *like.shape[1:])) for s in states]
            )
        return out

    def split(self, sizes: list[int]) -> list[StreamState]:
        """The inverse of :meth:`stack`: states of ``sizes`` rows each."""
        if sizes == [self.batch]:
            return [self]
        parts: list[StreamState] = []
        start = 0
        for size in sizes:
            part = StreamState.__new__(StreamState)
            rows = slice(start, start + size)
            part.batch = size
            part.keys = [k[rows] for k in self.keys]
            part.values = [v[rows] for v in self.values]
            part.valid = self.valid[rows]
            part.position = self.position[rows]
            part.fresh = self.fresh[rows]
            part.tails = {m: t[rows] for m, t in self.tails.items()}
            part._clear_lead()
            parts.append(part)
            start += size
        return parts

    def adopt(self, other: StreamState) -> None:
        """Take ``other``'s contents (a row of a batched decode) as this stream's own."""
        self.batch, self.tails = other.batch, other.tails
        self.keys, self.values = other.keys, other.values
        self.valid, self.position = other.valid, other.position
        self.fresh = list(other.fresh)
        self._clear_lead()


class WindowKV:
    """The transformer layers' key/value store for one streamed chunk (a ``KVStore``).

    Returns the carried window followed by the chunk's own keys and values,
    and keeps the newest ``window - 1`` of them for the next chunk.
    """

    def __init__(self, state: StreamState):
        self.state = state

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.state
        keys = torch.cat((state.keys[layer], k), dim=2)
        values = torch.cat((state.values[layer], v), dim=2)
        keep = state.keys[layer].shape[2]
        state.keys[layer] = keys[:, :, keys.shape[2] - keep :].contiguous()
        state.values[layer] = values[:, :, values.shape[2] - keep :].contiguous()
        return keys, values
