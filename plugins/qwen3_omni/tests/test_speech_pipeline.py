"""qwen3-omni (speech out) through the real runtime: seven processes, colocated, or one.

The built-in speech demo (tiny preset, dummy weights, CPU): greedy answers
must not depend on where the stages run; the talker must speak while the
thinker still writes; a text-only request must never need the talker, even
while the talker's process is dead.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

from media_samples import audio_part, image_part, user

from omni_core.plugins import OmniPlugins
from omni_core.runtime import RequestFailed
from omni_core.testing import plan_on_cpu

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_omni_demo.toml"
STAGES = (
    "preprocessing",
    "image_encoder",
    "audio_encoder",
    "thinker",
    "decode",
    "talker_ar",
    "code2wav",
)
ONE_PROCESS = [flag for stage in STAGES for flag in (f"--{stage}.process", "all")]
FAST = ["--talker_ar.factory.max_frames", "40", "--runtime.restart_backoff", "0.2"]
LONG = ["--preprocessing.factory.max_tokens", "200", "--talker_ar.factory.max_frames", "400"]

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _spoken(messages: list[dict], voice: str = "ethan", **sampling: Any) -> dict:
    return {
        "messages": messages,
        "sampling": {"max_tokens": 12, "temperature": 0, **sampling},
        "modalities": ["text", "audio"],
        "voice": voice,
    }


def _written(messages: list[dict]) -> dict:
    return {"messages": messages, "sampling": {"max_tokens": 6, "temperature": 0}}


async def _answer(runtime: Any, data: dict) -> dict[str, Any]:
    """Text, audio and the arrival time of every text delta and audio chunk."""
    handle = await runtime.dispatch(data)
    text, audio, times = [], [], {"decode": [], "code2wav": []}
    async for event in handle.stream():
        if event.final:
            continue
        times[event.stage].append(time.monotonic())
        (text if event.stage == "decode" else audio).append(event.data)
    joined = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    return {"text": "".join(text), "audio": joined, "times": times}


def _planned(base: Path, *flags: str, frames: list[str] = FAST):
    return plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=[*frames, *flags])


REQUESTS = {
    "text": _spoken([{"role": "user", "content": "Hello there"}]),
    "media": _spoken(user(image_part(64, 96), audio_part(1.0)), voice="chelsie"),
}


@pytest.mark.slow
async def test_seven_processes_colocated_and_one_give_the_same_speech(short_tmp):
    layouts = {
        "seven": plan_on_cpu(OmniPlugins(env={}), short_tmp / "7", deploy=DEMO, flags=FAST),
        "colocated": plan_on_cpu(
            OmniPlugins(env={}),
            short_tmp / "c",
            pipeline="qwen3-omni-colocated",
            flags=[*FAST, "--model-path", "tiny", *_dummy()],
        ),
        "one": _planned(short_tmp / "1", *ONE_PROCESS),
    }
    assert [len(p.plan.processes) for p in layouts.values()] == [7, 6, 1]
    answers: dict[str, dict[str, Any]] = {}
    for name, planned in layouts.items():
        async with planned.runtime() as runtime:
            answers[name] = {key: await _answer(runtime, data) for key, data in REQUESTS.items()}
    for key in REQUESTS:
        seven = answers["seven"][key]
        assert seven["text"] and seven["audio"].size > 0
        for other in ("colocated", "one"):
            assert answers[other][key]["text"] == seven["text"]
            np.testing.assert_allclose(answers[other][key]["audio"], seven["audio"], atol=1e-5)
    assert answers["seven"]["text"]["audio"].size != answers["seven"]["media"]["audio"].size or (
        not np.allclose(answers["seven"]["text"]["audio"], answers["seven"]["media"]["audio"])
    )


def _dummy() -> list[str]:
    """Every weight-loading stage of the colocated pipeline on seeded dummy weights, float32."""
    flags = []
    for stage in ("image_encoder", "audio_encoder", "thinker", "talker_ar", "code2wav"):
        flags += [f"--{stage}.factory.load_format", "dummy", f"--{stage}.factory.dtype", "float32"]
    return flags


@pytest.mark.slow
async def test_the_talker_speaks_before_the_thinker_has_finished(short_tmp):
    async with _planned(short_tmp / "early", frames=LONG).runtime() as runtime:
        data = _spoken([{"role": "user", "content": "Tell me a long story"}], max_tokens=200)
        answer = await _answer(runtime, data)
    first_audio, last_text = answer["times"]["code2wav"][0], answer["times"]["decode"][-1]
    assert len(answer["times"]["decode"]) > 100
    assert first_audio < last_text


@pytest.mark.slow  # kills and restarts the talker process, ~25 s (make test-all)
async def test_text_only_requests_never_need_the_talker_even_when_it_dies(short_tmp):
    backoff = ["--runtime.restart_backoff", "0.2"]
    async with _planned(short_tmp / "kill", *backoff, frames=LONG).runtime() as runtime:
        written = _written([{"role": "user", "content": "Hi"}])
        before = await _answer(runtime, written)
        assert before["text"] and before["audio"].size == 0
        story = [{"role": "user", "content": "Tell me a long story"}]
        handle = await runtime.dispatch(_spoken(story, max_tokens=200))
        # Killed mid-answer: once its first audio is out, not after a fixed sleep, which a
        # faster codec outran (this long answer goes on for hundreds of frames).
        with anyio.fail_after(60):
            async for event in handle.stream():
                if event.stage == "code2wav":
                    break
        victim = runtime.children["talker_ar"]
        os.kill(victim.proc.pid, signal.SIGKILL)
        with pytest.raises(RequestFailed) as failed:
            await handle.result()
        assert "talker_ar" in str(failed.value)
        during = await _answer(runtime, written)  # served while the talker restarts
        assert during["text"] == before["text"]
        with anyio.fail_after(60):
            while runtime.health()["processes"]["talker_ar"]["state"] != "healthy":
                await anyio.sleep(0.1)
        after = await _answer(runtime, _spoken([{"role": "user", "content": "Hi"}]))
        assert after["audio"].size > 0
        assert runtime.health()["processes"]["talker_ar"]["restarts"] == 1
