"""What a placement policy returns: an assignment per instance, or refusals with fixes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Refusal:
    """One reason a deployment cannot be planned, and what would fix it.

    ``stage`` and ``gpu`` say what the reason is about (for grouping and
    tests); ``fix`` is a concrete change (a flag, a setting) or None.
    """

    message: str
    stage: str | None = None
    gpu: int | None = None
    fix: str | None = None


@dataclass(frozen=True)
class Assignment:
    """Where one stage instance runs and the memory it may take on each of its GPUs.

    ``gpus`` empty means the host (no GPU). ``gpu_memory_fraction`` is per GPU;
    ``total_reserve_bytes`` is an absolute budget per GPU; set one of them at most
    (the checks refuse both, as the schema does for a stage). ``share_source`` says where
    the share came from: ``declared`` (the config), ``estimate`` (a policy
    computed it) or ``none``.
    """

    instance: str
    gpus: tuple[int, ...] = ()
    gpu_memory_fraction: float | None = None
    total_reserve_bytes: int | None = None
    share_source: str = "none"


@dataclass
class PlacementResult:
    """A policy's answer: one assignment per instance, or refusals."""

    assignments: dict[str, Assignment] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def assign(self, assignment: Assignment) -> None:
        self.assignments[assignment.instance] = assignment

    def refuse(self, message: str, **about: Any) -> None:
        self.refusals.append(Refusal(message, **about))
