"""GPU memory: a module's tensors handed to other processes as CUDA IPC handles.

The leader's tensors stay where they were loaded; for each storage the
leader exports a CUDA IPC handle (``cudaIpcGetMemHandle``, through torch's
``_share_cuda_``), and a follower on the same GPU opens it
(``cudaIpcOpenMemHandle``, through ``UntypedStorage._new_shared_cuda``) and
rebinds its module's tensors to views of it: no copy, the weights exist once
in GPU memory. The handles travel as JSON (bytes in hex) over the leader's
authenticated socket, never pickled. CUDA cannot map memory read-only in
another process: followers must not write their weights (inference does not).

The leader must outlive its followers' use of the memory: a leader that dies
takes the group down, and the runtime restarts it, leader first. Checked on
a GPU machine only (``tests/runtime/test_weight_share_cuda.py``, marked ``cuda``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...engine import mapped
from .host import check_same, describe, named_tensors


def _encode(value: Any) -> Any:
    return {"hex": value.hex()} if isinstance(value, bytes) else value


def _decode(value: Any) -> Any:
    return bytes.fromhex(value["hex"]) if isinstance(value, dict) else value


def export(module: nn.Module) -> dict[str, Any]:
    """The manifest of ``module``'s CUDA tensors: one IPC handle per storage."""
    storages: dict[int, int] = {}
    handles: list[list[Any]] = []
    entries = []
    for name, tensor in named_tensors(module):
        if tensor.device.type != "cuda":
            raise ValueError(
                f"CUDA weight sharing takes CUDA tensors; {name} is on {tensor.device}"
            )
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in storages:
            storages[storage.data_ptr()] = len(handles)
            handles.append([_encode(v) for v in storage._share_cuda_()])
        entries.append(
            {
                **describe(name, tensor),
                "storage": storages[storage.data_ptr()],
                "storage_offset": tensor.storage_offset(),
            }
        )
    return {"kind": "cuda", "handles": handles, "tensors": entries}


def attach(module: nn.Module, manifest: dict[str, Any], what: str) -> list[Any]:
    """Rebind ``module``'s CUDA tensors to the leader's; returns the opened storages."""
    entries = {e["name"]: e for e in manifest["tensors"]}
    check_same(named_tensors(module), entries, what)
    storages = [
        torch.UntypedStorage._new_shared_cuda(*[_decode(v) for v in handle])
        for handle in manifest["handles"]
    ]
    for storage in storages:  # the leader's memory: never to be copied or repacked here
        mapped.add_range(storage.data_ptr(), max(storage.nbytes(), 1), "cuda")
    with torch.no_grad():
        for name, tensor in named_tensors(module):
            entry = entries[name]
            dtype = getattr(torch, entry["dtype"])
            view = torch.empty(0, dtype=dtype, device=tensor.device)
            view.set_(
                storages[entry["storage"]], entry["storage_offset"], entry["shape"], entry["stride"]
            )
            tensor.data = view
    return storages
