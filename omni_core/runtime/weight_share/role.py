"""This process's part in weight sharing: leader, follower, or neither.

The worker sets it from the plan before it builds the stages, so that the
stage factories' loading code (:func:`~.seam.share_weights`) knows whether to
load and publish, to map, or just to load. Torch-free: the worker imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

SOCKET_PREFIX = "w"  # w0.sock: shorter than any process socket, so it fits sun_path


@dataclass
class Role:
    """``kind`` is "leader", "follower" or "none"; ``address`` the leader's socket."""

    kind: str = "none"
    process: str = ""
    leader: str = ""
    address: str = ""
    secret: bytes = field(default=b"", repr=False)
    published: dict[str, Any] = field(default_factory=dict)  # key -> publication (leader)
    mapped: dict[str, Any] = field(default_factory=dict)  # key -> mapping (follower)


_current = Role()


def socket_path(runtime_dir: str, group_index: int) -> str:
    """The leader's socket of sharing group ``group_index``, inside the private runtime dir."""
    return os.path.join(runtime_dir, f"{SOCKET_PREFIX}{group_index}.sock")


def role_in_plan(plan: Any, process: str, secret: bytes) -> Role:
    """What ``process`` does in ``plan``'s weight sharing (a "none" role outside any group)."""
    for index, group in enumerate(plan.weight_share.groups):
        if process == group.leader or process in group.followers:
            return Role(
                kind="leader" if process == group.leader else "follower",
                process=process,
                leader=group.leader,
                address=socket_path(plan.endpoints.runtime_dir, index),
                secret=secret,
            )
    return Role(process=process)


def activate(role: Role) -> None:
    global _current
    _current = role


def current() -> Role:
    return _current
