"""The MOSS-TTS demo with its backbone split over two rank processes (gloo), served.

``examples/moss_tts_demo.toml`` with ``tts_engine`` in a process of its own:
at ``tp_size = 2`` (``tts_engine_tp0`` leads, ``tts_engine_tp1`` holds the
other half of every layer) the speech must be the speech of ``tp_size = 1``,
byte for byte: the same codes, decoded by the same vocoder. Killing the
follower rank fails the request in flight with a 503 naming it, and the
group comes back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "moss_tts_demo.toml"
ENGINE = ["--tts_engine.process", "engine"]
RANKS = ["--tts_engine.tp_size", "2", "--tts_engine.gpu", "[0, 1]"]
OWN = [*ENGINE, "--preprocessing.factory.max_frames", "40"]
TP2 = [*OWN, *RANKS]
TEXTS = ["Hello there.", "A second sentence, a little longer."]


def _speak(live, text: str, **body) -> bytes:
    reply = live.client(timeout=120).audio.speech.create(
        model="tiny", voice="default", input=text, extra_body={"seed": 7, **body}
    )
    return reply.content


@pytest.mark.slow
def test_two_ranks_speak_the_audio_of_one():
    audio = {}
    for name, flags in (("tp1", OWN), ("tp2", TP2)):
        with short_private_dir() as base:
            planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)
            ranks = [p.name for p in planned.plan.processes if p.tp_rank is not None]
            assert ranks == ([] if name == "tp1" else ["engine_tp0", "engine_tp1"])
            with planned.serve() as live:
                audio[name] = [_speak(live, text) for text in TEXTS]
    assert all(len(wav) > 44 + 2 * 1920 for wav in audio["tp1"])  # whole frames of speech
    assert audio["tp2"] == audio["tp1"]


@pytest.mark.slow
def test_a_killed_rank_fails_its_request_with_a_503_and_the_group_comes_back():
    flags = [*ENGINE, *RANKS, "--preprocessing.factory.max_frames", "2000"]
    with short_private_dir() as base:
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)
        with planned.serve() as live:
            runtime = live.runtime
            before = _speak(live, TEXTS[0], max_frames=40)
            failure: list[BaseException] = []

            def long_request() -> None:
                try:
                    _speak(live, "A long one. " * 40)
                except BaseException as exc:
                    failure.append(exc)

            worker = threading.Thread(target=long_request)
            worker.start()
            deadline = time.monotonic() + 60
            while not runtime.coordinator.inflight and time.monotonic() < deadline:
                time.sleep(0.005)
            # In flight, so bound to the group: whether its first step has run or not,
            # losing a rank fails it (a tiny random model may end a segment early).
            os.kill(runtime.children["engine_tp1"].proc.pid, signal.SIGKILL)
            worker.join(60)
            assert failure, "the request in flight was not failed"
            assert isinstance(failure[0], openai.APIStatusError)
            assert failure[0].status_code == 503
            assert "process engine_tp1 was killed by SIGKILL" in str(failure[0])
            deadline = time.monotonic() + 120
            while runtime.health()["status"] != "healthy" and time.monotonic() < deadline:
                time.sleep(0.2)
            assert runtime.health()["processes"]["engine_tp0"]["restarts"] == 1
            assert _speak(live, TEXTS[0], max_frames=40) == before
