"""``GET /metrics``: Prometheus metrics of the HTTP API, the audio it serves and the runtime.

Built on ``prometheus_client`` with one :class:`~prometheus_client.CollectorRegistry`
per app (never the process-wide default), so that several apps in one process
(the tests) keep separate counts. Three sources feed it:

- :class:`MetricsMiddleware` counts and times every HTTP request;
- :class:`AudioMeter` times the audio of every request where it reaches the
  client: ``Service.pieces`` reports each audio chunk of every API (speech,
  chat, WebSocket) as it hands it to the endpoint, so a slow-reading client
  shows up as late chunks;
- :class:`~.runtime_metrics.RuntimeCollector` reads the runtime's state
  (admission, bindings, and the stage processes' heartbeats) at scrape time.

Labels stay bounded: ``endpoint`` is the route's path template, or
``other`` for a path no route serves (so clients cannot grow the label set);
``method`` is one of the standard HTTP methods or ``other``; ``process`` and
``stage`` come from the deployment plan.

Metrics (type; labels): meaning

- ``omni_requests_total`` (counter; endpoint, method, status): HTTP requests
  answered; status 499 means the client went away first.
- ``omni_request_duration_seconds`` (histogram; endpoint): from the request's
  arrival to the last byte of its response.
- ``omni_time_to_first_audio_seconds`` (histogram; endpoint): from the
  request's arrival to its first audio chunk.
- ``omni_audio_real_time_factor`` (histogram; endpoint): per request with
  audio, wall time from its arrival to its last audio chunk divided by the
  seconds of audio it produced (below 1: faster than real time).
- ``omni_audio_seconds_total`` (counter; endpoint): seconds of audio handed
  to clients (PCM16 mono at the pipeline's sample rate).
- ``omni_audio_chunk_interval_seconds`` (histogram; endpoint): the time
  between consecutive audio chunks of one request.
- ``omni_audio_underruns_total`` (counter; endpoint): audio chunks that
  arrived after the audio delivered before them had played out, for a client
  playing from the first chunk (see :mod:`..audio.playback`). Measured for every
  request, streamed or not: it says whether the pipeline keeps up with real
  time for this request.
- ``omni_inflight_requests`` (gauge): requests admitted and not finished.
- ``omni_max_inflight_requests`` (gauge): the admission limit.
- ``omni_runtime_requests_total`` (counter; outcome = completed|failed):
  requests the runtime finished.
- ``omni_process_inflight_requests`` (gauge; process, replica): requests
  bound to each replica of each logical process (a request is bound to one
  replica of every process).
- ``omni_process_up`` (gauge; process, state): 1 when the OS process is
  healthy, else 0; its current state is the label.
- ``omni_process_state`` (gauge; process, state): 1 for the state the OS
  process is in, 0 for each other state (starting, healthy, unresponsive,
  restarting, failed, stopped).
- ``omni_process_restarts_total`` (counter; process): restarts of the process.
- ``omni_stage_queue_depth`` (gauge; process, stage, state = running|waiting):
  requests running in the stage, or waiting for the sources of a fan-in,
  from the process's last heartbeat.
- ``omni_engine_requests`` (gauge; process, stage, state = running|waiting): each
  engine stage's own scheduler (SGLang's, or the torch engine's) batch and queue.
- ``omni_engine_prompt_positions`` (counter; process, stage, source =
  computed|cached): prompt positions the torch engine's prefills computed, and
  those copied from a prompt head another request had computed
  (``engine.disable_radix_cache``), since the process started.
- ``omni_engine_prefill_chunks`` (counter; process, stage): prefills the torch
  engine ran on a chunk of a long prompt, not its last
  (``engine.chunked_prefill_size``), since the process started.
- ``omni_engine_compiled_step_misses`` (counter; process, stage): decode steps
  the torch engine ran eagerly because they missed every graph it compiled at
  start-up (``engine.enable_torch_compile``; the stage's log names the failed
  guard once per shape), since the process started.
- ``omni_stage_run_seconds`` (summary; process, stage): ``_count`` runs of
  the stage that ended and ``_sum`` their seconds, since the process started
  (a restart resets them, as Prometheus expects of counters).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder

from ..audio.playback import Playback
from .runtime_metrics import RuntimeCollector

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
INTERVAL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 5.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"


class Metrics:
    """The registry of one app and the metrics recorded in it."""

    def __init__(self, runtime: Any = None, endpoints: Iterable[str] = ()):
        self.endpoints = set(endpoints)  # paths served; create_app adds its routes'
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "omni_requests",
            "HTTP requests by endpoint, method and status.",
            ["endpoint", "method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "omni_request_duration_seconds",
            "Time from request to the end of the response.",
            ["endpoint"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.audio = AudioMeter(self)
        if runtime is not None:
            registry.register(RuntimeCollector(runtime))

    def endpoint(self, path: str) -> str:
        return path if path in self.endpoints else OTHER

    def observe_request(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else OTHER
        self.requests.labels(endpoint, method, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The metrics in the format the scraper's Accept header asks for, and its type."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class AudioMeter:
    """The audio metrics; ``Service.pieces`` opens one :class:`RequestAudio` per request."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        registry = metrics.registry
        self.first_audio = Histogram(
            "omni_time_to_first_audio_seconds",
            "Time from request to the first audio chunk.",
            ["endpoint"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.real_time_factor = Histogram(
            "omni_audio_real_time_factor",
            "Wall time from request to its last audio chunk per second of audio produced.",
            ["endpoint"],
            buckets=RTF_BUCKETS,
            registry=registry,
        )
        self.seconds = Counter(
            "omni_audio_seconds",
            "Seconds of audio handed to clients.",
            ["endpoint"],
            registry=registry,
        )
        self.interval = Histogram(
            "omni_audio_chunk_interval_seconds",
            "Time between consecutive audio chunks of a request.",
            ["endpoint"],
            buckets=INTERVAL_BUCKETS,
            registry=registry,
        )
        self.underruns = Counter(
            "omni_audio_underruns",
            "Audio chunks that arrived after the audio before them had played out.",
            ["endpoint"],
            registry=registry,
        )

    def request(self, path: str, started: float) -> RequestAudio:
        """The meter of one request served at ``path``, which arrived at ``started``."""
        return RequestAudio(self, self.metrics.endpoint(path), started)


class RequestAudio:
    """One request's audio clock (:class:`.playback.Playback`) feeding the audio metrics."""

    def __init__(self, meter: AudioMeter, endpoint: str, started: float):
        self.meter, self.endpoint = meter, endpoint
        self.playback = Playback(started)
        self.ended = False

    def chunk(self, seconds: float) -> None:
        """A chunk of ``seconds`` of audio is being handed to the client now."""
        if seconds <= 0:
            return  # nothing to play: neither a first chunk nor the end of a stall
        meter, endpoint = self.meter, self.endpoint
        arrival = self.playback.chunk(seconds, time.perf_counter())
        meter.seconds.labels(endpoint).inc(seconds)
        if arrival.first_audio is not None:
            meter.first_audio.labels(endpoint).observe(arrival.first_audio)
        if arrival.interval is not None:
            meter.interval.labels(endpoint).observe(arrival.interval)
        underruns = meter.underruns.labels(endpoint)  # a 0 series, not none, until one happens
        if arrival.underrun:
            underruns.inc()

    def end(self) -> None:
        """The request's audio is over (however it ended): record its real-time factor once."""
        if self.ended:
            return
        self.ended = True
        factor = self.playback.real_time_factor
        if factor is not None:
            self.meter.real_time_factor.labels(self.endpoint).observe(factor)


class MetricsMiddleware:
    """Counts every HTTP request by endpoint, method and status and times it to its last byte.

    The endpoint is the path template of the route that served the request
    (set by Starlette's router), else the path if some route serves it (a
    request refused before routing, e.g. for its API key), else ``other``.
    """

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
            route = getattr(scope.get("route"), "path", None)
            endpoint = route if route is not None else self.metrics.endpoint(scope["path"])
            seconds = time.perf_counter() - started
            self.metrics.observe_request(endpoint, scope["method"], status[0], seconds)
