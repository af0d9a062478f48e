"""Host memory: a module's tensors moved into one sealed ``memfd``, mapped read-only.

Why a ``memfd`` and not a named segment: it has no name, so nothing can be
left in ``/dev/shm`` however a process ends (SIGTERM, SIGKILL, a failed
start). Its memory lives while a descriptor or a mapping refers to it, and
the kernel drops both when a process exits. The leader writes the weights
once, drops its writable mapping and seals the file (``F_SEAL_FUTURE_WRITE``):
from then on no write and no writable mapping of it is possible, and every
process (leader too) reads the same pages through a read-only mapping.

Tensors keep their identity: each parameter and buffer gets the mapped view
as its ``.data``, so tied weights stay tied and whatever holds a reference
sees the shared copy. A write to a mapped weight is a segmentation fault,
not a silent divergence between replicas.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import warnings
from typing import Any

import torch
from torch import nn

from ...engine import mapped

ALIGN = 64
NAME = "omni-weights"  # shows as "/memfd:omni-weights (deleted)" in /proc/PID/maps
# F_SEAL_FUTURE_WRITE (Linux 5.1; 0x10 where Python does not name it) rather than
# F_SEAL_WRITE: the leader's own read-only mapping exists already, and the kernel counts
# a shared mapping of a writable descriptor as possibly writable, refusing F_SEAL_WRITE.
_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | _FUTURE_WRITE


def named_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and buffer of ``module`` by name, tied ones under each name."""
    out = list(module.named_parameters(remove_duplicate=False))
    out += list(module.named_buffers(remove_duplicate=False))
    return sorted(out, key=lambda item: item[0])


def describe(name: str, tensor: torch.Tensor) -> dict[str, Any]:
    return {
        "name": name,
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "stride": list(tensor.stride()),
    }


class Mapping:
    """One read-only mapping of a weight file, recorded as mapped weights while open."""

    def __init__(self, fd: int, size: int):
        self.size = size
        self.map = mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, mmap.PROT_READ)
        with warnings.catch_warnings():  # read-only on purpose: torch warns about it
            warnings.simplefilter("ignore", UserWarning)
            self.base = torch.frombuffer(self.map, dtype=torch.uint8)
        self.address = self.base.data_ptr()
        mapped.add_range(self.address, max(size, 1))

    def view(self, entry: dict[str, Any]) -> torch.Tensor:
        dtype = getattr(torch, entry["dtype"])
        start, nbytes = entry["offset"], entry["nbytes"]
        flat = self.base[start : start + nbytes].view(dtype)  # the whole storage
        offset = flat.storage_offset() + entry["storage_offset"]
        return flat.as_strided(entry["shape"], entry["stride"], offset)


def publish(module: nn.Module) -> tuple[dict[str, Any], int, Mapping]:
    """Move ``module``'s tensors into a sealed memfd; (manifest, descriptor, mapping).

    Storage by storage, so that the leader never holds two copies of more
    than one tensor: each is copied, then rebound to the read-only mapping,
    and its private copy freed.
    """
    tensors = named_tensors(module)
    devices = {t.device.type for _, t in tensors}
    if devices - {"cpu"}:
        raise ValueError(f"host weight sharing takes CPU tensors, got {sorted(devices)}")
    storages: dict[int, tuple[int, int]] = {}  # storage address -> (file offset, nbytes)
    size = 0
    for _, tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in storages:
            storages[storage.data_ptr()] = (size, storage.nbytes())
            size += -(-storage.nbytes() // ALIGN) * ALIGN
    fd = os.memfd_create(NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, max(size, 1))
        reader = Mapping(fd, size)
        writer = mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        target = torch.frombuffer(writer, dtype=torch.uint8)
        entries = []
        for name, tensor in tensors:
            storage = tensor.untyped_storage()
            offset, nbytes = storages[storage.data_ptr()]
            if offset >= 0:
                source = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,))
                target[offset : offset + nbytes].copy_(source)
                del source
                storages[storage.data_ptr()] = (-offset - 1, nbytes)  # copied
            else:
                offset = -offset - 1
            entry = {
                **describe(name, tensor),
                "offset": offset,
                "nbytes": nbytes,
                "storage_offset": tensor.storage_offset(),
            }
            entries.append(entry)
        del target
        # Rebind every tensor only now: a storage is shared by several names (ties, views).
        for (_, tensor), entry in zip(tensors, entries, strict=True):
            _rebind(tensor, reader, entry)
        writer.close()
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return {"kind": "host", "size": size, "tensors": entries}, fd, reader


def attach(module: nn.Module, manifest: dict[str, Any], fd: int, what: str) -> Mapping:
    """Rebind ``module``'s tensors to the leader's, mapped read-only from ``fd``.

    The descriptor is closed here (the mapping keeps the memory); the module's
    own storage (uninitialised, never touched) is freed as each tensor is rebound.
    """
    try:
        entries = {e["name"]: e for e in manifest["tensors"]}
        check_same(named_tensors(module), entries, what)
        reader = Mapping(fd, int(manifest["size"]))
    finally:
        os.close(fd)
    for name, tensor in named_tensors(module):
        _rebind(tensor, reader, entries[name])
    return reader


def check_same(tensors: list[tuple[str, torch.Tensor]], entries: dict[str, Any], what: str):
    """ValueError unless the module's tensors are the leader's: names, dtypes, shapes."""
    mine = {name: describe(name, t) for name, t in tensors}
    missing = sorted(set(entries) - set(mine))
    extra = sorted(set(mine) - set(entries))
    differ = [
        f"{n}: leader {entries[n]['dtype']}{entries[n]['shape']}, "
        f"here {mine[n]['dtype']}{mine[n]['shape']}"
        for n in sorted(set(mine) & set(entries))
        if (entries[n]["dtype"], entries[n]["shape"]) != (mine[n]["dtype"], mine[n]["shape"])
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) only the leader has ({', '.join(missing[:3])})")
    if extra:
        problems.append(f"{len(extra)} tensor(s) only this process has ({', '.join(extra[:3])})")
    if differ:
        problems.append("; ".join(differ[:3]))
    if problems:
        raise ValueError(
            f"{what}: the leader's weights do not match this model: " + "; ".join(problems)
        )


def _rebind(tensor: torch.Tensor, reader: Mapping, entry: dict[str, Any]) -> None:
    with torch.no_grad():
        tensor.data = reader.view(entry)
