"""Which process serves a stage, given a request's replica binding.

Where that process listens, and over which transport, is :mod:`.links`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.model import DeploymentPlan
from ..schema import PipelineConfig


@dataclass(frozen=True)
class RoutingTable:
    """Leader process of each (logical process, replica), and each stage's logical process."""

    stage_process: dict[str, str]
    leaders: dict[tuple[str, int], str]
    replicas: dict[str, int]

    @classmethod
    def of(cls, plan: DeploymentPlan, config: PipelineConfig) -> RoutingTable:
        leaders: dict[tuple[str, int], str] = {}
        replicas: dict[str, int] = {}
        for process in plan.processes:
            if process.leader:
                leaders[(process.logical, process.replica)] = process.name
            replicas[process.logical] = max(replicas.get(process.logical, 0), process.replica + 1)
        return cls(
            stage_process={s.name: config.process_of(s) for s in config.stages},
            leaders=leaders,
            replicas=replicas,
        )

    def process_for(self, stage: str, binding: dict[str, int]) -> str:
        logical = self.stage_process[stage]
        return self.leaders[(logical, binding.get(logical, 0))]
