"""Broadcasting a step's inputs from rank 0, as tensors only: no frame can run code.

Rank 0 sends an operation code and a value built of ``None``, ``bool``,
``int``, ``float``, tensors, and lists or tuples of those (a forward pass's
arguments: embeddings, positions, a mask, cache slots, deepstack rows). The
value travels as an ``int64`` header describing it (kinds, dtypes, shapes,
the scalars themselves) followed by one broadcast per tensor, allocated on
the receiving side from the header. Nothing is pickled: a peer that is not
one of ours can at worst send numbers, never objects, which keeps the
runtime's rule that no message between processes can run code.

Three collectives plus one per tensor per step; on one host with gloo that is
tens of microseconds each, small beside a forward pass.
"""

from __future__ import annotations

import struct
from typing import Any

import torch

from .group import TPGroup

_NONE, _BOOL, _INT, _FLOAT, _TENSOR, _LIST, _TUPLE = range(7)
_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]
_CODE = {dtype: code for code, dtype in enumerate(_DTYPES)}
MAX_HEADER = 1 << 20  # int64 words; a header beyond it is refused, not allocated


def encode(value: Any) -> tuple[list[int], list[torch.Tensor]]:
    """``value`` as header words and the tensors it holds, in order."""
    header: list[int] = []
    tensors: list[torch.Tensor] = []

    def walk(item: Any) -> None:
        if item is None:
            header.append(_NONE)
        elif isinstance(item, bool):
            header.extend((_BOOL, int(item)))
        elif isinstance(item, int):
            header.extend((_INT, item))
        elif isinstance(item, float):
            header.extend((_FLOAT, struct.unpack("<q", struct.pack("<d", item))[0]))
        elif isinstance(item, torch.Tensor):
            if item.dtype not in _CODE:
                raise TypeError(f"a step cannot carry a {item.dtype} tensor")
            header.extend((_TENSOR, _CODE[item.dtype], item.dim(), *item.shape))
            tensors.append(item)
        elif isinstance(item, (list, tuple)):
            header.extend((_LIST if isinstance(item, list) else _TUPLE, len(item)))
            for part in item:
                walk(part)
        else:
            raise TypeError(f"a step cannot carry a {type(item).__name__}")

    walk(value)
    return header, tensors


def decode(header: list[int], make: Any) -> Any:
    """The value ``header`` describes; ``make(dtype, shape)`` supplies each tensor."""
    at = 0

    def take() -> int:
        nonlocal at
        if at >= len(header):
            raise ValueError("a step header ended early")
        at += 1
        return header[at - 1]

    def walk() -> Any:
        kind = take()
        if kind == _NONE:
            return None
        if kind == _BOOL:
            return bool(take())
        if kind == _INT:
            return take()
        if kind == _FLOAT:
            return struct.unpack("<d", struct.pack("<q", take()))[0]
        if kind == _TENSOR:
            code, ndim = take(), take()
            if not 0 <= code < len(_DTYPES) or not 0 <= ndim <= 8:
                raise ValueError(f"a step header names dtype {code} with {ndim} dimensions")
            shape = [take() for _ in range(ndim)]
            if any(n < 0 for n in shape):
                raise ValueError(f"a step header names a negative shape {shape}")
            return make(_DTYPES[code], shape)
        if kind in (_LIST, _TUPLE):
            items = [walk() for _ in range(take())]
            return items if kind == _LIST else tuple(items)
        raise ValueError(f"a step header has an unknown kind {kind}")

    value = walk()
    if at != len(header):
        raise ValueError(f"a step header has {len(header) - at} words left over")
    return value


class StepChannel:
    """Rank 0 ``send``s (op, value); every other rank ``recv``s the same, in the same order."""

    def __init__(self, group: TPGroup):
        self.group = group
        self.device = group.device

    def send(self, op: int, value: Any) -> None:
        header, tensors = encode(value)
        self.group.broadcast(torch.tensor([op, len(header)], dtype=torch.int64, device=self.device))
        if header:
            self.group.broadcast(torch.tensor(header, dtype=torch.int64, device=self.device))
        for tensor in tensors:
            self.group.broadcast(tensor.to(self.device).contiguous())

    def recv(self) -> tuple[int, Any]:
        top = torch.zeros(2, dtype=torch.int64, device=self.device)
        self.group.broadcast(top)
        op, size = (int(v) for v in top.tolist())
        if not 0 <= size <= MAX_HEADER:
            raise ValueError(f"a step header of {size} words is refused")
        if not size:
            return op, None
        words = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.group.broadcast(words)
        header = words.tolist()
        shapes: list[tuple[torch.dtype, list[int]]] = []
        decode(header, lambda dtype, shape: shapes.append((dtype, shape)))  # validate first
        received = []
        for dtype, shape in shapes:
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
            self.group.broadcast(tensor)
            received.append(tensor)
        parts = iter(received)
        return op, decode(header, lambda dtype, shape: next(parts))
