"""The runtime's state as Prometheus metrics, read when ``/metrics`` is scraped.

Nothing here is counted by the HTTP server: the coordinator (in this
process) knows admission and bindings, and each stage process reports its
stages' queue depth and run times in its heartbeats (see
:mod:`omni_core.runtime.messages`), which ``runtime.health()`` returns. The
collector copies that state at scrape time, so its values are as fresh as
the last heartbeat (at most a second old) and nothing is counted twice:
every series belongs to exactly one OS process (``process`` is its name in
the plan, ``front``, ``front@r1`` or ``front@r1_tp0``), or, for in-flight
requests, to one replica of a logical process. The metrics are listed in
:mod:`omni_core.serve.common.metrics`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

# Every state a process can be in (omni_core.runtime.processes.Child.state): a fixed label set.
PROCESS_STATES = ("starting", "healthy", "unresponsive", "restarting", "failed", "stopped")
QUEUE_STATES = ("running", "waiting")
PROMPT_SOURCES = ("computed", "cached")  # TorchEngine.prompt_positions


class RuntimeCollector(Collector):
    """Reads ``runtime.health()`` and the coordinator's bindings on every scrape."""

    def __init__(self, runtime: Any):
        self.runtime = runtime

    def describe(self) -> list[Metric]:
        return []  # no values at registration: the runtime may not have started yet

    def collect(self) -> Iterator[Metric]:
        health = self.runtime.health()
        coordinator = self.runtime.coordinator
        yield _gauge(
            "omni_inflight_requests", "Requests admitted and not finished.", health["inflight"]
        )
        yield _gauge("omni_max_inflight_requests", "The admission limit.", health["max_inflight"])
        outcomes = CounterMetricFamily(
            "omni_runtime_requests",
            "Requests the runtime finished, by outcome.",
            labels=["outcome"],
        )
        outcomes.add_metric(["completed"], coordinator.completed)
        outcomes.add_metric(["failed"], coordinator.failed)
        yield outcomes
        yield _bindings(coordinator)
        yield from _processes(health["processes"])


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _bindings(coordinator: Any) -> GaugeMetricFamily:
    """In flight per replica of each logical process, idle replicas included (as 0).

    A request is bound to one replica of every logical process, so the sum
    over one process's replicas is the number in flight; a sum over
    processes counts a request once per process it is bound to.
    """
    family = GaugeMetricFamily(
        "omni_process_inflight_requests",
        "Requests bound to each replica of each logical process.",
        labels=["process", "replica"],
    )
    for process, count in sorted(coordinator.replicas.items()):
        for replica in range(count):
            family.add_metric([process, str(replica)], coordinator.load.get((process, replica), 0))
    return family


def _processes(processes: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "omni_process_up",
        "1 when the process is healthy; its state is a label.",
        labels=["process", "state"],
    )
    state = GaugeMetricFamily(
        "omni_process_state",
        "1 for the state each process is in, 0 for the others.",
        labels=["process", "state"],
    )
    restarts = CounterMetricFamily(
        "omni_process_restarts", "Restarts of each process.", labels=["process"]
    )
    depth = GaugeMetricFamily(
        "omni_stage_queue_depth",
        "Requests in each stage: running, or waiting for the sources of a fan-in.",
        labels=["process", "stage", "state"],
    )
    engine = GaugeMetricFamily(
        "omni_engine_requests",
        "Requests in each engine stage's scheduler (SGLang's or omni's torch engine): in its "
        "running batch, or waiting in its queue.",
        labels=["process", "stage", "state"],
    )
    prompts = CounterMetricFamily(
        "omni_engine_prompt_positions",
        "Prompt positions each torch engine stage's prefills computed, and copied from a "
        "prompt head another request had computed (engine.disable_radix_cache).",
        labels=["process", "stage", "source"],
    )
    chunks = CounterMetricFamily(
        "omni_engine_prefill_chunks",
        "Prefills each torch engine stage ran on a chunk of a long prompt, not its last "
        "(engine.chunked_prefill_size).",
        labels=["process", "stage"],
    )
    misses = CounterMetricFamily(
        "omni_engine_compiled_step_misses",
        "Decode steps each torch engine stage ran eagerly because they missed every graph "
        "it compiled at start-up (engine.enable_torch_compile); the log names the guard.",
        labels=["process", "stage"],
    )
    runs = SummaryMetricFamily(
        "omni_stage_run_seconds",
        "Time requests spent in each stage (runs that ended), since the process started.",
        labels=["process", "stage"],
    )
    for name, info in sorted(processes.items()):
        current = info["state"]
        up.add_metric([name, current], int(current == "healthy"))
        states = PROCESS_STATES if current in PROCESS_STATES else (*PROCESS_STATES, current)
        for each in states:
            state.add_metric([name, each], int(each == current))
        restarts.add_metric([name], info["restarts"])
        for stage, counts in sorted(info.get("queue", {}).items()):
            for queue in QUEUE_STATES:
                depth.add_metric([name, stage, queue], counts.get(queue, 0))
                if f"engine_{queue}" in counts:
                    engine.add_metric([name, stage, queue], counts[f"engine_{queue}"])
        for stage, run in sorted(info.get("runs", {}).items()):
            runs.add_metric([name, stage], count_value=run["count"], sum_value=run["seconds"])
            for source in PROMPT_SOURCES:
                if f"prompt_{source}" in run:
                    prompts.add_metric([name, stage, source], run[f"prompt_{source}"])
            if "prefill_chunks" in run:
                chunks.add_metric([name, stage], run["prefill_chunks"])
            if "compiled_misses" in run:
                misses.add_metric([name, stage], run["compiled_misses"])
    yield from (up, state, restarts, depth, engine, prompts, chunks, misses, runs)
