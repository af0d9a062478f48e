"""``GET /metrics`` as Prometheus parses it, against a server of its own (exact counts).

The server runs t-speech with two replicas of the ``back`` process (the audio
stage), so that per-replica series exist and a sum over replicas must not
count a request twice. Values that come from the stage processes' heartbeats
(queue depth, stage run times) are at most one report old: the tests wait
for them.
"""

from __future__ import annotations

import base64
import random
import string
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import omni_test_speech as ts
import pytest
from omni_test_speech import CHUNK_SAMPLES, SAMPLE_RATE
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import parse_wav, raw

from omni_core.plugins import OmniPlugins
from omni_core.serve.audio.playback import Playback
from omni_core.serve.common.metrics import METHODS
from omni_core.serve.common.runtime_metrics import PROCESS_STATES
from omni_core.testing import LiveServer, plan_on_cpu

SPEECH, CHAT = "/v1/audio/speech", "/v1/chat/completions"
TEXT = "the quick brown fox"  # four words: four 50 ms chunks
CHUNK_SECONDS = CHUNK_SAMPLES / SAMPLE_RATE
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    plugins = OmniPlugins(env={})
    plugins.register(ts, ts.HERE)
    flags = ["--processes.back.num_replicas", "2"]
    base = Path(tmp_path_factory.mktemp("metrics"))
    planned = plan_on_cpu(
        plugins, base, pipeline="t-speech", flags=flags, policy=None, plugin_modules=[ts.HERE]
    )
    live = LiveServer(planned).start()
    try:
        # every process has reported its stages once: (prep, synth, audio, audio) x 2 states
        settle(live, lambda s: len(series(s, "omni_stage_queue_depth")) == 4 * 2)
        yield live
    finally:
        live.stop()


def scrape(server) -> Samples:
    reply = raw("GET", f"{server.url}/metrics")
    assert reply.status_code == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    found: Samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}"
    return samples[key]


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for sample, labels in samples if sample == name]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, tags), v in samples.items() if n == name and wanted <= tags)


def settle(server, check: Callable[[Samples], bool], limit: float = 5.0) -> Samples:
    """Scrape until ``check`` holds (heartbeats come every 0.5 s); fail after ``limit`` s."""
    deadline = time.monotonic() + limit
    while True:
        samples = scrape(server)
        if check(samples):
            return samples
        assert time.monotonic() < deadline, "the metrics did not settle"
        time.sleep(0.1)


def speech(server, text: str = TEXT, **extra) -> bytes:
    body = {"input": text, "voice": "alice", "response_format": "pcm", **extra}
    reply = raw("POST", f"{server.url}{SPEECH}", json_body=body)
    assert reply.status_code == 200, reply.content[:200]
    return reply.content


def seconds_of(pcm: bytes) -> float:
    return len(pcm) / 2 / SAMPLE_RATE


def test_each_kind_of_request_is_counted_timed_and_its_audio_measured(server):
    plain = speech(server)
    streamed = speech(server, stream=True)
    reply = raw(
        "POST",
        f"{server.url}{CHAT}",
        json_body={"messages": [{"role": "user", "content": TEXT}], "modalities": ["audio"]},
    )
    assert reply.status_code == 200, reply.content[:200]
    _, chat_pcm = parse_wav(
        base64.b64decode(reply.json()["choices"][0]["message"]["audio"]["data"])
    )
    refused = raw("POST", f"{server.url}{SPEECH}", json_body={"input": "hi", "voice": "zed"})
    assert refused.status_code == 400
    assert raw("GET", f"{server.url}/v1/nothing").status_code == 404

    # the stage run counts come with the next heartbeats
    # (each process's own heartbeat: wait for both the audio and the synth processes)
    s = settle(
        server,
        lambda s: (
            total(s, "omni_stage_run_seconds_count", stage="audio") >= 3
            and total(s, "omni_stage_run_seconds_count", stage="synth") >= 3
        ),
    )

    def requests(endpoint: str, method: str, status: int) -> float:
        return total(s, "omni_requests_total", endpoint=endpoint, method=method, status=str(status))

    assert requests(SPEECH, "POST", 200) == 2
    assert requests(SPEECH, "POST", 400) == 1
    assert requests(CHAT, "POST", 200) == 1
    assert requests("other", "GET", 404) == 1
    for endpoint, count in ((SPEECH, 3), (CHAT, 1), ("other", 1)):
        assert value(s, "omni_request_duration_seconds_count", endpoint=endpoint) == count
    received = {SPEECH: seconds_of(plain) + seconds_of(streamed), CHAT: seconds_of(chat_pcm)}
    assert received == {SPEECH: 8 * CHUNK_SECONDS, CHAT: 4 * CHUNK_SECONDS}
    for endpoint, requests_with_audio in ((SPEECH, 2), (CHAT, 1)):
        tag = {"endpoint": endpoint}
        assert value(s, "omni_time_to_first_audio_seconds_count", **tag) == requests_with_audio
        assert value(s, "omni_audio_real_time_factor_count", **tag) == requests_with_audio
        assert value(s, "omni_audio_real_time_factor_sum", **tag) > 0
        assert value(s, "omni_audio_seconds_total", **tag) == pytest.approx(received[endpoint])
        # four chunks a request: three intervals between them
        assert value(s, "omni_audio_chunk_interval_seconds_count", **tag) == 3 * requests_with_audio
        # counted (the series exists); whether a 50 ms chunk came in time depends on the
        # machine's load, so how many is asserted only where the test controls it (below)
        assert value(s, "omni_audio_underruns_total", **tag) >= 0

    # runtime state: both replicas of back, each stage's queue, each process's state
    assert value(s, "omni_inflight_requests") == 0
    assert value(s, "omni_runtime_requests_total", outcome="completed") == 3
    failed = server.runtime.coordinator.failed  # 1 if the pipeline refused the voice
    assert value(s, "omni_runtime_requests_total", outcome="failed") == failed
    bindings = series(s, "omni_process_inflight_requests")
    assert sorted((b["process"], b["replica"]) for b in bindings) == [
        ("back", "0"),
        ("back", "1"),
        ("front", "0"),
    ]
    assert total(s, "omni_process_inflight_requests") == 0
    processes = ["back@r0", "back@r1", "front"]
    stages = {"back@r0": ["audio"], "back@r1": ["audio"], "front": ["prep", "synth"]}
    for process in processes:
        assert value(s, "omni_process_up", process=process, state="healthy") == 1
        assert value(s, "omni_process_restarts_total", process=process) == 0
        states = {
            labels["state"]: value(s, "omni_process_state", **labels)
            for labels in series(s, "omni_process_state")
            if labels["process"] == process
        }
        assert states == {state: float(state == "healthy") for state in PROCESS_STATES}
        for stage in stages[process]:
            for queue in ("running", "waiting"):
                tag = {"process": process, "stage": stage, "state": queue}
                assert value(s, "omni_stage_queue_depth", **tag) == 0
    # every request that got audio ran the audio stage once, on one replica or the other
    assert total(s, "omni_stage_run_seconds_count", stage="audio") == 3
    assert total(s, "omni_stage_run_seconds_count", stage="synth") == 3
    assert total(s, "omni_stage_run_seconds_sum", stage="audio") > 0


def test_a_pipeline_slower_than_real_time_underruns_and_a_fast_one_does_not(server):
    def underruns_and_long_gaps() -> tuple[float, float]:
        s = scrape(server)
        gaps = "omni_audio_chunk_interval_seconds_bucket"
        long_gaps = value(s, gaps, endpoint=SPEECH, le="+Inf") - value(
            s, gaps, endpoint=SPEECH, le="0.1"
        )
        return value(s, "omni_audio_underruns_total", endpoint=SPEECH), long_gaps

    # Margins no load can break: the fast pipeline's chunks hold 10 s of audio each (a
    # chunk would have to come 10 s late to underrun), the slow one waits 0.5 s between
    # 50 ms chunks. The exact accounting is tested under a controlled clock (below).
    underruns, long_gaps = underruns_and_long_gaps()
    fast = speech(server, stream=True, test_chunk_seconds=10)
    assert seconds_of(fast) == 4 * 10
    assert underruns_and_long_gaps()[0] == underruns
    # Each chunk after the first finds the buffer dry, unless a stall of 0.45 s let the
    # next one catch up with it; the last comes 1.5 s after the first, while 0.2 s of
    # audio lasts 0.2 s, so however late the chunks arrive at least one stall is heard.
    slow = speech(server, stream=True, test_chunk_delay=0.5)
    assert seconds_of(slow) == 4 * CHUNK_SECONDS
    more_underruns, more_long_gaps = underruns_and_long_gaps()
    assert 1 <= more_underruns - underruns <= 3
    assert 1 <= more_long_gaps - long_gaps <= 3


def test_random_paths_and_methods_do_not_grow_the_label_set(server):
    before = scrape(server)
    rng = random.Random(15)
    for _ in range(100):
        path = "/" + "".join(rng.choices(string.ascii_lowercase + "/", k=12))
        assert raw("GET", f"{server.url}{path}").status_code == 404
    for method in ("BREW", "PROPFIND", "X" + "".join(rng.choices(string.ascii_uppercase, k=8))):
        assert raw(method, f"{server.url}/v1/models").status_code == 405
        assert raw(method, f"{server.url}/zz/{method}").status_code == 404
    after = scrape(server)
    routes = server.server.config.app.state.metrics.endpoints  # every route's path template
    assert {SPEECH, CHAT, "/v1/models", "/health", "/metrics"} <= routes
    for name in ("omni_requests_total", "omni_request_duration_seconds_count"):
        for labels in series(after, name):
            assert labels["endpoint"] in routes | {"other"}
            assert labels.get("method", "GET") in METHODS | {"other"}
        assert len(series(after, name)) - len(series(before, name)) <= 3
    grown = total(after, "omni_requests_total", endpoint="other", method="GET", status="404")
    was = total(before, "omni_requests_total", endpoint="other", method="GET", status="404")
    assert grown - was == 100
    odd = total(after, "omni_requests_total", endpoint="/v1/models", method="other", status="405")
    assert odd == 3


def test_the_playback_clock_counts_each_stall_once():
    playback = Playback(started=10.0)
    first = playback.chunk(0.5, now=10.2)  # plays until 10.7
    assert (first.first_audio, first.interval, first.underrun) == (pytest.approx(0.2), None, False)
    assert not playback.chunk(0.5, now=10.7).underrun  # just in time: plays until 11.2
    stalled = playback.chunk(0.5, now=11.5)  # dry since 11.2
    assert stalled.underrun and stalled.interval == pytest.approx(0.8)
    # playback resumed at 11.5 with this chunk: the next one is due by 12.0, not 11.7
    assert not playback.chunk(0.5, now=11.9).underrun
    assert playback.underruns == 1 and playback.audio_seconds == 2.0
    assert playback.real_time_factor == pytest.approx((11.9 - 10.0) / 2.0)
    assert Playback(started=0.0).real_time_factor is None
