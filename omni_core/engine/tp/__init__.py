"""Tensor parallelism for the torch engine: one process per rank, rank 0 leads.

A stage with ``tp_size = N`` runs as N processes (the plan's
``<process>_tp<rank>``). Each holds its shard of the attention and MLP
weights (Megatron-style: column-split q/k/v and gate/up, row-split o_proj and
down with an all-reduce), and they talk through ``torch.distributed``: gloo on
the CPU, NCCL on GPUs, met at a rendezvous the runtime sets up privately for
each group start (a file store in the deployment's 0700 runtime directory:
no port is reserved, nothing outlives the run).

Rank 0 is the stage as the rest of the graph sees it: it receives requests,
runs the engine's scheduler, and before each forward pass broadcasts the
pass's inputs (:class:`Mirror`); every rank then runs the same pass on its
shard, and rank 0 samples and emits. The other ranks run
:class:`FollowerStage`, which takes no requests.

Modules: :mod:`.group` (rendezvous, process-group init, what a broken group
does), :mod:`.channel` (tensor-only broadcast of a step's inputs),
:mod:`.layers` (sharded linear layers), :mod:`.mirror` (leader and follower).
"""

from .channel import StepChannel
from .group import TPGroup, TPGroupBroken, TPStartError, current_group, init_group, leave_group
from .layers import AllReduceOutput, RowParallelLinear, split_columns, split_rows
from .mirror import FollowerStage, Mirror

__all__ = [
    "AllReduceOutput",
    "FollowerStage",
    "Mirror",
    "RowParallelLinear",
    "StepChannel",
    "TPGroup",
    "TPGroupBroken",
    "TPStartError",
    "current_group",
    "init_group",
    "leave_group",
    "split_columns",
    "split_rows",
]
