"""The one call model loading code makes: fill a module's weights, or map the leader's.

A stage factory builds its module with uninitialised storage (on the meta
device, then ``to_empty``: no page of it is touched), and instead of filling
it directly calls::

    share_weights(key, module, fill)

* in a process outside any sharing group: ``fill(module)``, nothing else;
* in a group's leader: ``fill(module)``, then the module's tensors move into
  shared memory (a sealed ``memfd`` on the CPU; CUDA IPC handles on a GPU) and
  are published under ``key`` for the followers;
* in a follower: ``fill`` is not called; the leader's tensors are mapped
  read-only and become the module's (same names, dtypes and shapes, or a
  clear error), and the untouched storage is freed.

Why the module is built by the caller, even in a follower: the model's
structure (its Python objects, hooks and rotary tables) comes from code, not
from the weights; only the weights cross between processes. ``key`` names
what is loaded (checkpoint, part, dtype, load format, seed): the leader and
its followers run the same configuration, so they compute the same keys.
Repacking a shared weight afterwards (:mod:`omni_core.engine.cpu_linear`)
keeps it shared.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .channel import ShareError, WeightServer, fetch
from .role import current


def share_weights(key: str, module: Any, fill: Callable[[Any], Any]) -> Any:
    """Fill ``module`` (or map its weights from the leader); returns ``module``."""
    role = current()
    if role.kind == "none":
        fill(module)
        return module
    if role.kind == "leader":
        if key in role.published and role.published[key][1] is not None:
            # Loaded twice in this process (two caches, say): map the first copy again.
            from .host import attach

            manifest, fd, _ = role.published[key]
            role.mapped[key] = attach(module, manifest, os.dup(fd), f"weights {key!r}")
            return module
        fill(module)
        if key not in role.published:  # (on a GPU a second copy stays private)
            _publish(role, key, module)
        return module
    _attach(role, key, module)
    return module


def _device(module: Any) -> str:
    devices = {t.device.type for t in module.parameters()} | {
        t.device.type for t in module.buffers()
    }
    return "cuda" if "cuda" in devices else "cpu"


def _publish(role: Any, key: str, module: Any) -> None:
    started = time.perf_counter()
    if _device(module) == "cuda":
        from .cuda_ipc import export

        role.published[key] = (export(module), None, module)
    else:
        from .host import publish

        manifest, fd, mapping = publish(module)
        role.published[key] = (manifest, fd, mapping)
    count = len(role.published[key][0]["tensors"])
    print(
        f"weight sharing: published {key!r} ({count} tensors) in "
        f"{time.perf_counter() - started:.2f} s",
        flush=True,
    )


def _attach(role: Any, key: str, module: Any) -> None:
    manifest, fd = fetch(role.address, role.secret, key, role.leader)
    what = f"weights {key!r} of leader {role.leader}"
    try:
        if manifest.get("kind") == "cuda":
            from .cuda_ipc import attach

            role.mapped[key] = attach(module, manifest, what)
        elif fd is None:
            raise ShareError(f"{what}: the leader sent host weights without their descriptor")
        else:
            from .host import attach as attach_host

            descriptor, fd = fd, None
            role.mapped[key] = attach_host(module, manifest, descriptor, what)
    except ValueError as exc:
        raise ShareError(str(exc)) from None
    finally:
        if fd is not None:
            os.close(fd)
    print(f"weight sharing: mapped {key!r} from {role.leader}", flush=True)


def serve(role: Any) -> WeightServer | None:
    """Start answering followers (a leader, once its stages are built); None otherwise."""
    if role.kind != "leader":
        return None

    def lookup(key: str) -> tuple[dict[str, Any], int | None]:
        if key not in role.published:
            known = ", ".join(sorted(role.published)) or "nothing"
            raise KeyError(f"published: {known}")
        manifest, fd, _ = role.published[key]
        return manifest, fd

    return WeightServer(role.address, role.secret, lookup)
