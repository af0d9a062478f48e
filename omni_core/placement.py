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
    from .plan.model import PlacementRequest, PlacementResult


class PlacementPolicy(ABC):
    """A named strategy that assigns stage instances to devices.

    Subclasses set :attr:`name` and :attr:`description` and implement
    :meth:`place`. ``place`` must be a pure function of its request: no I/O,
    no clock, no randomness, so that ``omni plan`` is deterministic.
    """

    name: str = ""
    description: str = ""

    @abstractmethod
    def place(self, request: PlacementRequest) -> PlacementResult:
        """Assign every instance of ``request`` or refuse with per-stage reasons."""
