"""Split a message into a small pickled skeleton and raw buffers, and back.

Why pickle at all: a stage's payload is Python data (dicts of tensors, token
lists, dataclasses); pickle already walks any object graph, so we let it walk
and intercept the big leaves with ``persistent_id``. Each torch tensor, numpy
array and large bytes-like object becomes a reference to a *buffer spec*;
only the skeleton (plain values plus references) is pickled. The buffers then
travel as raw bytes (socket transport) or in shared memory (shm transport),
never through pickle.

Why it cannot run code: the decoder resolves no global outside the allowlist
of :mod:`omni_core.wire` (plain data needs none; registered dataclasses and
enums are constructed, nothing is called by name), and the encoder refuses,
on the sending side and with the type's name, any object the decoder would
refuse. Buffer specs are plain strings and numbers, checked against the
buffer's size before anything is built from them.

torch and numpy are never imported here: a value can only be a tensor if torch
is already in ``sys.modules``, so we look there (the parent process, which
never imports torch, pays nothing).

What arrives: a tensor (or tensor subclass, such as a Parameter) as a
contiguous CPU ``torch.Tensor`` of the same dtype and shape (strides, device,
``requires_grad`` and view aliasing are not kept); a numpy array as a
contiguous array; ``bytes`` as ``bytes``, ``bytearray`` as ``bytearray``, a
``memoryview`` as a flat byte ``memoryview``. Sparse or quantized tensors and
object-dtype arrays are refused: convert them first.
"""

from __future__ import annotations

import ctypes
import io
import math
import pickle
import sys
from dataclasses import dataclass
from typing import Any

from ... import wire

# Bytes-like objects below this size stay inside the pickle: a separate raw
# frame costs more than copying a few hundred bytes.
SMALL_BYTES = 1024

TORCH, NUMPY, BYTES, BYTEARRAY, MEMORYVIEW = "torch", "numpy", "bytes", "bytearray", "memoryview"

_PLAIN = frozenset({str, int, float, bool, type(None), tuple, list, dict, set, frozenset})
# Small bytes-likes stay in the skeleton; these pickle without naming a global too.
_INLINE = frozenset({bytes, bytearray, complex, slice, range})


class WireFormatError(ValueError):
    """A frame's buffer table or skeleton is not something this codec produces."""


@dataclass(frozen=True)
class BufferSpec:
    """What the receiver needs to rebuild one buffer: kind, dtype, shape, size."""

    kind: str
    dtype: Any  # torch dtype name ("bfloat16"), numpy dtype descr ("<f4"), or None
    shape: tuple[int, ...]
    nbytes: int


class Source:
    """One buffer on the sending side: the object, plus ways to read its bytes."""

    __slots__ = ("obj", "spec")

    def __init__(self, obj: Any, spec: BufferSpec) -> None:
        self.obj = obj
        self.spec = spec

    def contiguous_view(self) -> memoryview:
        """The bytes as a flat memoryview (copies only a non-contiguous source)."""
        obj, kind = self.obj, self.spec.kind
        if kind == TORCH:
            tensor = obj.detach()
            if tensor.device.type != "cpu":
                tensor = tensor.cpu()
            tensor = tensor.contiguous()
            self.obj = tensor  # keep the (possibly new) storage alive while sending
            raw = (ctypes.c_ubyte * self.spec.nbytes).from_address(tensor.data_ptr())
            return memoryview(raw).cast("B")
        if kind == NUMPY:
            import numpy

            array = numpy.ascontiguousarray(obj)
            self.obj = array
            return memoryview(array.reshape(-1).view(numpy.uint8))
        return memoryview(obj).cast("B")

    def copy_into(self, dest: memoryview) -> None:
        """Copy the bytes into ``dest`` (shared memory), straight from any strides."""
        obj, spec = self.obj, self.spec
        if spec.kind == TORCH:
            import torch

            target = torch.frombuffer(dest, dtype=torch.uint8, count=spec.nbytes)
            target = target.view(obj.dtype).view(obj.shape)
            target.copy_(obj.detach())
        elif spec.kind == NUMPY:
            import numpy

            target = numpy.frombuffer(dest, dtype=obj.dtype, count=obj.size).reshape(obj.shape)
            numpy.copyto(target, obj, casting="no")
        else:
            dest[: spec.nbytes] = memoryview(obj).cast("B")


def _spec_of(obj: Any) -> BufferSpec | None:
    """A buffer spec if ``obj`` should travel as raw bytes, else None (pickle it)."""
    cls = type(obj)
    if cls in _PLAIN:
        return None
    if cls is bytes or cls is bytearray:
        if len(obj) < SMALL_BYTES:
            return None
        return BufferSpec(BYTES if cls is bytes else BYTEARRAY, None, (len(obj),), len(obj))
    if cls is memoryview:
        if not obj.c_contiguous:
            return None
        return BufferSpec(MEMORYVIEW, None, (obj.nbytes,), obj.nbytes)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.is_quantized:
            raise wire.WireTypeError(
                f"a {obj.layout} or quantized tensor cannot cross a process boundary; "
                "send obj.to_dense() or obj.dequantize()"
            )
        name = str(obj.dtype).removeprefix("torch.")
        return BufferSpec(TORCH, name, tuple(obj.shape), obj.numel() * obj.element_size())
    numpy = sys.modules.get("numpy")
    if numpy is not None and cls is numpy.ndarray:
        if obj.dtype.hasobject:
            raise wire.WireTypeError(
                "a numpy array of Python objects (dtype object) cannot cross a process "
                "boundary; send a numeric array or plain lists"
            )
        descr = numpy.lib.format.dtype_to_descr(obj.dtype)
        return BufferSpec(NUMPY, descr, obj.shape, obj.nbytes)
    return None


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, sources: list[Source]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._sources = sources

    def persistent_id(self, obj: Any) -> int | None:
        spec = _spec_of(obj)
        if spec is None:
            cls = type(obj)
            if cls in _PLAIN or cls in _INLINE:
                return None
            named = obj if isinstance(obj, type) else cls
            if not wire.is_allowed(named.__module__, named.__qualname__):
                raise wire.refuse(obj)
            return None
        self._sources.append(Source(obj, spec))
        return len(self._sources) - 1


def encode(message: Any) -> tuple[bytes, list[Source]]:
    """The pickled skeleton of ``message`` and its buffers, in reference order."""
    sources: list[Source] = []
    file = io.BytesIO()
    _Pickler(file, sources).dump(message)
    return file.getvalue(), sources


class _Unpickler(pickle.Unpickler):
    """Builds plain data, the given buffers and allowlisted classes; calls nothing else."""

    def __init__(self, file: io.BytesIO, objects: list[Any], *, globals_allowed: bool) -> None:
        super().__init__(file)
        self._objects = objects
        self._globals_allowed = globals_allowed

    def find_class(self, module: str, name: str) -> Any:
        if self._globals_allowed and wire.is_allowed(module, name):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refused to decode {module}.{name}: not a type allowed on the wire"
        )

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is not int or not 0 <= pid < len(self._objects):
            raise pickle.UnpicklingError(f"a buffer reference {pid!r} names no buffer")
        return self._objects[pid]


def decode(skeleton: bytes, objects: list[Any]) -> Any:
    """The message, with buffer references replaced by the rebuilt ``objects``."""
    return _Unpickler(io.BytesIO(skeleton), objects, globals_allowed=True).load()


def dumps_plain(value: Any) -> bytes:
    """Frame metadata (tuples, lists, str, int, bytes) as bytes."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def loads_plain(data: bytes | bytearray) -> Any:
    """Frame metadata back; any global at all (a class, a function) is refused."""
    return _Unpickler(io.BytesIO(data), [], globals_allowed=False).load()


def checked_spec(kind: Any, dtype: Any, shape: Any, nbytes: Any) -> BufferSpec:
    """A buffer spec from a frame's table, or WireFormatError if it is inconsistent.

    The dtype must be a real dtype (a torch attribute that is not a dtype, or
    an object dtype, is refused) and the shape must account for exactly
    ``nbytes``, so nothing is built past the end of the received buffer.
    """
    if type(nbytes) is not int or nbytes < 0:
        raise WireFormatError(f"buffer size {nbytes!r} is not a size")
    if type(shape) is not tuple or not all(type(d) is int and d >= 0 for d in shape):
        raise WireFormatError(f"buffer shape {shape!r} is not a shape")
    if kind == TORCH:
        import torch

        dtype_obj = getattr(torch, dtype, None) if isinstance(dtype, str) else None
        if not isinstance(dtype_obj, torch.dtype):
            raise WireFormatError(f"{dtype!r} is not a torch dtype")
        itemsize = dtype_obj.itemsize
    elif kind == NUMPY:
        import numpy

        try:
            dtype_obj = numpy.lib.format.descr_to_dtype(dtype)
        except Exception as exc:
            raise WireFormatError(f"{dtype!r} is not a numpy dtype: {exc}") from None
        if dtype_obj.hasobject:
            raise WireFormatError("an object-dtype array cannot be received")
        itemsize = dtype_obj.itemsize
    elif kind in (BYTES, BYTEARRAY, MEMORYVIEW):
        itemsize = 1
    else:
        raise WireFormatError(f"unknown buffer kind {kind!r}")
    if math.prod(shape) * itemsize != nbytes:
        raise WireFormatError(f"shape {shape} of {dtype!r} does not make {nbytes} bytes")
    return BufferSpec(kind, dtype, shape, nbytes)


def build(spec: BufferSpec, buffer: Any, offset: int, *, owned: bool) -> Any:
    """The object ``spec`` describes, over ``buffer[offset:offset + spec.nbytes]``.

    Tensors, arrays and memoryviews *view* the buffer (no copy: they keep it
    alive). ``bytes`` must copy. ``owned`` says the buffer holds exactly this one
    object and nobody else uses it, so a bytearray can be returned as is.
    """
    kind, nbytes = spec.kind, spec.nbytes
    if kind == TORCH:
        import torch

        dtype = getattr(torch, spec.dtype)
        if nbytes == 0:
            return torch.empty(spec.shape, dtype=dtype)
        flat = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset)
        return flat.view(dtype).view(spec.shape)
    if kind == NUMPY:
        import numpy

        dtype = numpy.lib.format.descr_to_dtype(spec.dtype)
        if nbytes == 0:
            return numpy.empty(spec.shape, dtype=dtype)
        count = nbytes // dtype.itemsize
        return numpy.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(spec.shape)
    view = memoryview(buffer)[offset : offset + nbytes]
    if kind == BYTES:
        return bytes(view)
    if kind == BYTEARRAY:
        return buffer if owned and type(buffer) is bytearray else bytearray(view)
    return view
