"""A mixture's experts laid out as two stacked tensors, so that one grouped product runs them.

Why: routed through a Python loop, a mixture reads on the host how many
tokens each expert got (one device synchronisation per layer, 48 in a
Qwen3-Omni thinker step) and launches a few kernels per touched expert, so
on a GPU a decode step waits on the host and can never be captured as a CUDA
graph. With the experts' weights stacked, ``torch.nn.functional.grouped_mm``
multiplies every (token, expert) pair by its expert, one call each for gate,
up and down, from offsets that stay on the device (:mod:`.moe`).

The layout: ``gate_up`` ``[E, 2I, H]`` (expert ``e``'s ``gate_proj`` rows,
then its ``up_proj`` rows) and ``down`` ``[E, H, I]``. The experts keep their
modules and names (``experts.E.gate_proj.weight``, as the release stores
them): each weight is a view of its rows in the stack. So loading by name
(``copy_`` in place), the dummy fill, ``state_dict`` and weight sharing
(which maps storages and keeps every view's offset, so a follower's experts
lie stacked in the leader's memory) see what they saw, and nothing is held
twice.

Nothing here holds the stacked tensors: :func:`stacked_views` rebuilds the
two views from the first expert's weights at each call (a few microseconds),
so replacing the experts (a tensor-parallel shard, int8 layers, ``.to()``)
frees the old stack instead of keeping it alive behind a cache.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from omni_core.engine import cpu_linear, mapped

#: Where a mixture keeps its :class:`StackCheck` (a plain attribute: no state dict entry).
STACK_CHECK = "_omni_expert_stack"


@dataclass(frozen=True)
class StackCheck:
    """Whether the experts lay stacked when last looked at, and where they lay then.

    The anchors (the first expert's gate and the last expert's down weight
    addresses) change whenever the experts' weights are replaced, which every
    way of replacing them does for all experts at once; a change means look
    again.
    """

    anchors: tuple[int, int]
    stacked: bool


def _weights(experts: nn.ModuleList) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return [(e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight) for e in experts]


def _anchors(experts: nn.ModuleList) -> tuple[int, int]:
    return experts[0].gate_proj.weight.data_ptr(), experts[-1].down_proj.weight.data_ptr()


def plain_experts(experts: nn.ModuleList) -> bool:
    """Whether every expert is three bias-free float linear layers of one shape, dtype and
    device, of a kind the grouped product serves at least as fast.

    Other kinds keep the per-expert loop: int8 layers, and the CPU's bf16
    ``RowLinear`` (``omni_core.engine.cpu_linear``) where its one-row ``mv``
    route is this machine's faster kernel, as on the Intel machine that
    measured it beating the grouped product at a decode step's row or two
    per expert (release width, one thread: 6.8 against 9.0 ms a layer for
    one token; equal within noise from two tokens or two threads). Where
    that route is not taken (an AMD EPYC: ``cpu_kernel_choice``), a
    ``RowLinear`` is ``F.linear`` and the grouped product is faster: 54
    against 64 ms a layer for 8 tokens, one thread, equal at one token.
    """
    kinds: tuple[type, ...] = (nn.Linear,)
    if not cpu_linear.routes().bf16_mv_one_row:
        kinds = (nn.Linear, cpu_linear.RowLinear)
    first = experts[0]
    layers = ("gate_proj", "up_proj", "down_proj")
    shapes = [tuple(getattr(first, n).weight.shape) for n in layers]
    for expert in experts:
        for name, shape in zip(layers, shapes, strict=True):
            layer = getattr(expert, name, None)
            if type(layer) not in kinds or layer.bias is not None:
                return False
            weight = layer.weight
            if (
                tuple(weight.shape) != shape
                or not weight.is_floating_point()
                or weight.dtype != first.gate_proj.weight.dtype
                or weight.device != first.gate_proj.weight.device
            ):
                return False
    return shapes[0] == shapes[1] and shapes[2] == shapes[0][::-1]


def grouped_mm_aligned(intermediate: int, hidden: int, dtype: torch.dtype) -> bool:
    """Whether ``grouped_mm`` accepts these widths: every row a multiple of 16 bytes."""
    size = torch.empty((), dtype=dtype).element_size()
    return (intermediate * size) % 16 == 0 and (hidden * size) % 16 == 0


def stacked_views(experts: nn.ModuleList) -> tuple[torch.Tensor, torch.Tensor]:
    """``gate_up`` ``[E, 2I, H]`` and ``down`` ``[E, H, I]`` over the experts' own storage.

    Valid only where :func:`lies_stacked` said so; no copy, no device read.
    """
    gate, down = experts[0].gate_proj.weight, experts[0].down_proj.weight
    count, (inner, hidden) = len(experts), gate.shape
    gate_up = gate.as_strided((count, 2 * inner, hidden), (2 * inner * hidden, hidden, 1))
    stacked_down = down.as_strided((count, hidden, inner), (hidden * inner, inner, 1))
    return gate_up, stacked_down


def lies_stacked(experts: nn.ModuleList) -> bool:
    """Whether the experts' weights already are views of the stacked layout, in order:
    every gate and up in one storage, every down in one storage."""
    weights = _weights(experts)
    first_gate, _, first_down = weights[0]
    inner, hidden = first_gate.shape
    block = inner * hidden  # elements of one matrix
    gates, downs = first_gate.untyped_storage().data_ptr(), first_down.untyped_storage().data_ptr()
    gate_start, down_start = first_gate.storage_offset(), first_down.storage_offset()
    for index, (gate, up, down) in enumerate(weights):
        for tensor, storage, offset in (
            (gate, gates, gate_start + 2 * block * index),
            (up, gates, gate_start + 2 * block * index + block),
            (down, downs, down_start + block * index),
        ):
            if (
                tensor.untyped_storage().data_ptr() != storage
                or tensor.storage_offset() != offset
                or not tensor.is_contiguous()
            ):
                return False
    return True


def may_copy(experts: nn.ModuleList) -> bool:
    """Whether the weights are this process's own: never copy a leader's shared weights
    (a copy per follower would undo weight sharing).

    ``Tensor.is_shared()`` answers True for every CUDA tensor (any may be sent
    to another process), so on a GPU only :mod:`omni_core.engine.mapped`'s
    record of what was attached from a leader (CUDA IPC) says "not ours"; the
    first GPU check found a mixture moved to the GPU never stacked for that.
    """
    return not any(
        mapped.is_mapped(t) or (t.device.type == "cpu" and t.is_shared())
        for trio in _weights(experts)
        for t in trio
    )


@torch.no_grad()
def stack_experts(experts: nn.ModuleList, *, copy: bool = True) -> None:
    """Rebind the experts' weights to views of one new stacked layout.

    ``copy``: carry their values over; without it the stack is as
    uninitialised as a freshly built module's weights (no page of it
    touched), for a loader to fill. Peak memory: one more copy of this
    mixture's experts while it runs; each expert's old storage is freed as
    its weights are rebound.
    """
    weights = _weights(experts)
    gate = weights[0][0]
    inner, hidden = gate.shape
    count = len(experts)
    # Normal tensors even when first stacked inside a step's inference mode, so that a
    # later load_state_dict may still write into them.
    with torch.inference_mode(False):
        gate_up = torch.empty(count, 2 * inner, hidden, dtype=gate.dtype, device=gate.device)
        down = torch.empty(count, hidden, inner, dtype=gate.dtype, device=gate.device)
    for index, (expert, (g, u, d)) in enumerate(zip(experts, weights, strict=True)):
        if copy:
            gate_up[index, :inner].copy_(g)
            gate_up[index, inner:].copy_(u)
            down[index].copy_(d)
        expert.gate_proj.weight = nn.Parameter(gate_up[index, :inner], requires_grad=False)
        expert.up_proj.weight = nn.Parameter(gate_up[index, inner:], requires_grad=False)
        expert.down_proj.weight = nn.Parameter(down[index], requires_grad=False)


def stackable(experts: nn.ModuleList) -> bool:
    """Whether the experts are plain layers whose widths the grouped product accepts."""
    if not plain_experts(experts):
        return False
    inner, hidden = experts[0].gate_proj.weight.shape
    return grouped_mm_aligned(inner, hidden, experts[0].gate_proj.weight.dtype)


def ensure_stacked(holder: nn.Module, experts: nn.ModuleList) -> bool:
    """Whether ``experts`` can run as one grouped product now; stacks them if they may be.

    Looks again only when the experts' weights were replaced since the last
    call (their anchors moved); otherwise two address reads. Adopts a layout
    that is already stacked (built so, or mapped so from a weight-sharing
    leader) without copying; copies into a stack only weights this process
    owns.
    """
    anchors = _anchors(experts)
    check = holder.__dict__.get(STACK_CHECK)
    if check is not None and check.anchors == anchors:
        return check.stacked
    stacked = False
    if stackable(experts):
        if lies_stacked(experts):
            stacked = True
        elif may_copy(experts):
            stack_experts(experts, copy=experts[0].gate_proj.weight.device.type != "meta")
            stacked = True
    holder.__dict__[STACK_CHECK] = StackCheck(_anchors(experts), stacked)
    return stacked


def grouped_product_runs(device: torch.device, dtype: torch.dtype, tracing: bool) -> bool:
    """Whether the stacked path serves here, ``torch.nn.functional.grouped_mm`` taking
    these weights and gaining over the loop.

    On the CPU its loop over groups takes any float dtype (in a compiled
    trace, whose shape checks follow the CUDA kernel's, bfloat16 only). On
    CUDA only where its kernel is fused (:func:`graph_capturable`): elsewhere
    it copies the offsets to the host at each of a layer's three products,
    three waits where the loop has one.
    """
    if device.type == "cpu" and not tracing:
        return dtype.is_floating_point
    if device.type == "cuda":
        return graph_capturable(device, dtype)
    return dtype == torch.bfloat16


def graph_capturable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's grouped product runs without reading offsets on the host here.

    Only its fused CUDA kernel does: bfloat16 on compute capability 9.x
    (Hopper) and 10.x (Blackwell data-centre parts). Anywhere else it falls
    back to a loop over groups that copies the offsets to the host, which a
    CUDA graph cannot capture.
    """
    if device.type != "cuda" or dtype != torch.bfloat16:
        return False
    index = torch.device(device).index
    return _fused_kernel(torch.cuda.current_device() if index is None else index)


@functools.cache
def _fused_kernel(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] in (9, 10)
