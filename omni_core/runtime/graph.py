"""The stage graph of one pipeline, as the runtime routes requests through it.

Pure functions of the resolved config: who feeds whom, which edges stream,
which stages a routing decision skips, what a fan-in stage waits for, and
which terminal stages a request must hear from before it is complete.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..schema import PipelineConfig, StageConfig


@dataclass(frozen=True)
class StageGraph:
    """Edges and roles of the stages of one pipeline."""

    entry: str
    stages: dict[str, StageConfig]
    sources: dict[str, frozenset[str]] = field(default_factory=dict)
    terminals: frozenset[str] = frozenset()

    @classmethod
    def of(cls, config: PipelineConfig) -> StageGraph:
        stages = {s.name: s for s in config.stages}
        sources: dict[str, set[str]] = {name: set() for name in stages}
        for stage in config.stages:
            for target in stage.targets:
                sources[target].add(stage.name)
        entry = config.entry_stage or config.stages[0].name
        graph = cls(
            entry=entry,
            stages=stages,
            sources={k: frozenset(v) for k, v in sources.items()},
            terminals=frozenset(s.name for s in config.stages if s.terminal),
        )
        graph.check()
        return graph

    def check(self) -> None:
        """Refuse wiring the runtime cannot route, before any process starts."""
        problems = []
        for stage in self.stages.values():
            if not set(stage.stream_to) <= set(stage.targets):
                problems.append(
                    f"stage {stage.name!r}: field 'stream_to' names stages that are not in 'next'"
                )
            if stage.stream_to and stage.route_fn:
                problems.append(
                    f"stage {stage.name!r}: a streaming stage cannot have a route function "
                    "(chunks leave before the route could be chosen)"
                )
            for target in stage.stream_to:
                if self.stages[target].wait_for:
                    problems.append(
                        f"stage {stage.name!r}: field 'stream_to' names {target!r}, a fan-in "
                        "stage; a stage that waits for several sources cannot consume a stream"
                    )
            if stage.wait_for and not set(stage.wait_for) <= self.sources[stage.name]:
                missing = sorted(set(stage.wait_for) - self.sources[stage.name])
                problems.append(
                    f"stage {stage.name!r}: field 'wait_for' names {missing}, "
                    "which never send to it"
                )
        if self.sources[self.entry]:
            problems.append(f"entry stage {self.entry!r} must not be the target of another stage")
        if not self.terminals:
            problems.append("the pipeline has no terminal stage")
        if problems:
            raise ConfigError("the pipeline's topology cannot be routed: " + "; ".join(problems))

    def streams(self, source: str, target: str) -> bool:
        return target in self.stages[source].stream_to

    def skip_closure(self, skipped: Iterable[str]) -> frozenset[str]:
        """``skipped`` plus every stage all of whose sources are skipped."""
        closed = set(skipped)
        changed = True
        while changed:
            changed = False
            for name, sources in self.sources.items():
                if name not in closed and sources and sources <= closed:
                    closed.add(name)
                    changed = True
        return frozenset(closed)

    def expected_sources(self, stage: str, skipped: frozenset[str]) -> frozenset[str]:
        """The sources a fan-in stage waits for in one request."""
        wait_for = self.stages[stage].wait_for or []
        return frozenset(s for s in wait_for if s not in skipped)

    def expected_terminals(self, skipped: frozenset[str]) -> frozenset[str]:
        return self.terminals - skipped
