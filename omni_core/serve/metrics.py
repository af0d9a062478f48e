"""``GET /metrics``: Prometheus text exposition, written by hand.

A handful of counters and histograms do not justify a dependency; the format
is the plain text one (version 0.0.4). Request counts and latencies are
recorded by :class:`MetricsMiddleware` for every route (unknown paths share
one label, so clients cannot grow the label set); time to first audio chunk
by the endpoints; runtime state (in flight per process replica, process
state, restarts) is read from the runtime when scraped.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Histogram:
    def __init__(self, name: str, help: str, label: str):
        self.name, self.help, self.label = name, help, label
        self.series: dict[str, list[float]] = {}  # label value -> bucket counts, sum, count

    def observe(self, label: str, value: float) -> None:
        series = self.series.setdefault(label, [0.0] * (len(BUCKETS) + 2))
        for index, bound in enumerate(BUCKETS):
            if value <= bound:
                series[index] += 1
        series[-2] += value
        series[-1] += 1

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for label, series in sorted(self.series.items()):
            tag = f'{self.label}="{_escape(label)}"'
            for index, bound in enumerate(BUCKETS):
                out.append(f'{self.name}_bucket{{{tag},le="{bound:g}"}} {series[index]:g}')
            out.append(f'{self.name}_bucket{{{tag},le="+Inf"}} {series[-1]:g}')
            out.append(f"{self.name}_sum{{{tag}}} {series[-2]:.6f}")
            out.append(f"{self.name}_count{{{tag}}} {series[-1]:g}")
        return out


class Metrics:
    def __init__(self, endpoints: set[str]):
        self.endpoints = endpoints
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency = Histogram(
            "omni_request_duration_seconds",
            "Time from request to the end of the response.",
            "endpoint",
        )
        self.first_audio = Histogram(
            "omni_time_to_first_audio_seconds",
            "Time from request to the first audio chunk.",
            "endpoint",
        )

    def endpoint(self, path: str) -> str:
        return path if path in self.endpoints else "other"

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        endpoint = self.endpoint(path)
        self.requests[(endpoint, status)] += 1
        self.latency.observe(endpoint, seconds)

    def observe_first_audio(self, path: str, seconds: float) -> None:
        self.first_audio.observe(self.endpoint(path), seconds)

    def render(self, runtime: Any) -> str:
        out = [
            "# HELP omni_requests_total HTTP requests by endpoint and status.",
            "# TYPE omni_requests_total counter",
        ]
        for (endpoint, status), count in sorted(self.requests.items()):
            out.append(
                f'omni_requests_total{{endpoint="{_escape(endpoint)}",status="{status}"}} {count}'
            )
        out += self.latency.lines() + self.first_audio.lines()
        coordinator = runtime.coordinator
        out += [
            "# HELP omni_inflight_requests Requests admitted and not finished.",
            "# TYPE omni_inflight_requests gauge",
            f"omni_inflight_requests {coordinator.inflight}",
            "# HELP omni_max_inflight_requests The admission limit.",
            "# TYPE omni_max_inflight_requests gauge",
            f"omni_max_inflight_requests {coordinator.max_inflight}",
            "# HELP omni_runtime_requests_total Requests the runtime finished, by outcome.",
            "# TYPE omni_runtime_requests_total counter",
            f'omni_runtime_requests_total{{outcome="completed"}} {coordinator.completed}',
            f'omni_runtime_requests_total{{outcome="failed"}} {coordinator.failed}',
            "# HELP omni_process_inflight_requests Requests bound to each process replica.",
            "# TYPE omni_process_inflight_requests gauge",
        ]
        for (process, replica), count in sorted(coordinator.load.items()):
            out.append(
                f'omni_process_inflight_requests{{process="{_escape(process)}",'
                f'replica="{replica}"}} {count}'
            )
        health = runtime.health()["processes"]
        out += [
            "# HELP omni_process_up 1 when the process is healthy.",
            "# TYPE omni_process_up gauge",
        ]
        for name, info in sorted(health.items()):
            out.append(
                f'omni_process_up{{process="{_escape(name)}",state="{info["state"]}"}} '
                f"{int(info['state'] == 'healthy')}"
            )
        out += [
            "# HELP omni_stage_queue_depth Requests in each stage: running, or waiting for "
            "the sources of a fan-in.",
            "# TYPE omni_stage_queue_depth gauge",
        ]
        for name, info in sorted(health.items()):
            for stage, depth in sorted(info.get("queue", {}).items()):
                for state in ("running", "waiting"):
                    out.append(
                        f'omni_stage_queue_depth{{process="{_escape(name)}",'
                        f'stage="{_escape(stage)}",state="{state}"}} {depth.get(state, 0)}'
                    )
        out += [
            "# HELP omni_process_restarts_total Restarts of each process.",
            "# TYPE omni_process_restarts_total counter",
        ]
        for name, info in sorted(health.items()):
            out.append(
                f'omni_process_restarts_total{{process="{_escape(name)}"}} {info["restarts"]}'
            )
        return "\n".join(out) + "\n"


class MetricsMiddleware:
    """Counts every HTTP request by endpoint and status and times it to its last byte."""

    def __init__(self, app: Any, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def observe(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            self.metrics.observe_request(scope["path"], status[0], time.perf_counter() - started)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
