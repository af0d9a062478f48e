"""The interface of a placement policy: what a plugin implements to place stages.

The planner (:mod:`omni_core.plan`) expands replicas and tensor-parallel ranks
into stage instances, hands them with the GPU inventory to the chosen policy,
and checks what comes back. A policy decides, per instance, its GPU ids and its
memory budget, or refuses with reasons that are reported together.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .request import PlacementRequest
    from .result import PlacementResult


class PlacementPolicy(ABC):
    """A named strategy that assigns stage instances to devices.

    Subclasses set :attr:`name` and :attr:`description` and implement
    :meth:`place`. ``place`` must be a pure function of its request: no I/O,
    no clock, no randomness, so that ``omni plan`` is deterministic.

    A policy that sizes stages itself sets :attr:`uses_estimates`; the planner
    then asks the model plugins for per-stage memory estimates
    (``omni_estimate_memory``) and puts them in ``request.estimates``. Others
    never pay for estimating.

    Whatever ``place`` returns is then checked by the planner, whichever policy
    made it: GPU ids within the inventory, one GPU per process, memory shares
    within ``[placement] memory_limit``, no two processes racing for unpromised
    memory on one GPU.
    """

    name: str = ""
    description: str = ""
    uses_estimates: bool = False

    @abstractmethod
    def place(self, request: PlacementRequest) -> PlacementResult:
        """Assign every instance of ``request`` or refuse with per-stage reasons."""
