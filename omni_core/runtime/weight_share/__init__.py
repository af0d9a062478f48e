"""Weight sharing at run time: replicas in one sharing group hold one copy of the weights.

The plan (:mod:`omni_core.plan.weights`) makes the groups: replicas of one
process on one GPU, or on the host, with the lowest replica leading. Here is
how they run:

* the worker gives each process its :class:`~.role.Role` before the stages are
  built; stage factories load through :func:`share_weights`, which in the
  leader loads and publishes, in a follower maps (see :mod:`.seam`);
* on the CPU the weights live in one sealed, nameless ``memfd`` per key
  (:mod:`.host`), handed over the leader's authenticated socket
  (:mod:`.channel`) with ``SCM_RIGHTS``; on a GPU as CUDA IPC handles
  (:mod:`.cuda_ipc`);
* followers start once their leader is ready (the plan's start waves); a
  leader that dies is restarted with its followers, leader first (the
  runtime's supervision).

Torch-free at import: the worker imports this package in every process.
"""

from .channel import ShareError
from .role import Role, activate, current, role_in_plan
from .seam import serve, share_weights

__all__ = ["Role", "ShareError", "activate", "current", "role_in_plan", "serve", "share_weights"]
