"""``omni::looped_mixture``: a compiled step's call into a mixture whose experts loop.

Why an operator: the looped mixture (``SparseMoE._loop``) reads how many
tokens each expert received on the host and runs one product per touched
expert, a loop whose length changes every step. Left to dynamo, that is a
graph break in every sparse layer, and dynamo then runs the whole layer loop
around it eagerly: the thinker's compiled bf16 step on the CPU, where its
experts are blocked for oneDNN and so always loop, measured 0.92-0.93x
eager's throughput. As an operator the mixture is one opaque node: dynamo
traces the router, norms, attention and residuals of every layer into one
graph, inductor fuses them, and the experts run as eagerly as before, on
the same kernels, in the same order, so their numbers are eager's.

The graph names the mixture by a number, its ``handle`` tensor
(:mod:`omni_core.engine.graph_handles`);
its fake returns a tensor shaped like ``x``, which is all the graph needs.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_core.engine.graph_handles import Handles, number_tensor

#: Mixtures by the number a compiled step names them with (weak: a freed one leaves).
MIXTURES = Handles()


def register_mixture(mixture: Any) -> None:
    """Give ``mixture`` the ``handle`` tensor ``omni::looped_mixture`` finds it by."""
    number_tensor(mixture, MIXTURES.add(mixture))


def _looped_mixture(
    x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, mixture: torch.Tensor
) -> torch.Tensor:
    return MIXTURES[int(mixture)]._loop(x, weights, experts)


def _looped_mixture_shape(
    x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, mixture: torch.Tensor
) -> torch.Tensor:
    return torch.empty_like(x)


# torch.library.Library as omni::blocked_linear (omni_core.engine.cpu_blocked_weight):
# no per-call wrapper. CompositeExplicitAutograd: one implementation for every device,
# since int8 experts and GPUs without a fused grouped product loop too.
_LIBRARY = torch.library.Library("omni", "FRAGMENT")
_LIBRARY.define(
    "looped_mixture(Tensor x, Tensor weights, Tensor experts, Tensor mixture) -> Tensor"
)
_LIBRARY.impl("looped_mixture", _looped_mixture, "CompositeExplicitAutograd")
torch.library.register_fake("omni::looped_mixture", _looped_mixture_shape, lib=_LIBRARY)
