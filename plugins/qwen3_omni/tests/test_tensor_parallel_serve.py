"""The qwen3-omni-text demo with its thinker split over two rank processes (gloo), served.

The deployment is ``examples/qwen3_omni_text_demo.toml`` with the thinker in
a process of its own at ``tp_size = 2``: ``thinker_tp0`` takes the requests,
``thinker_tp1`` holds the other half of every layer. Greedy answers must be
the ones of ``tp_size = 1`` token for token; killing a rank must fail the
request in flight with a 503 that names it, and the group must come back.
The speech demo (``qwen3_omni_demo.toml``) with its thinker split must speak
the same audio: the talker reads the rows rank 0 captures.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")
openai = pytest.importorskip("openai")

from media_samples import audio_part, image_part, user  # noqa: E402

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_omni_text_demo.toml"
TP2 = ["--thinker.process", "thinker", "--thinker.tp_size", "2", "--thinker.gpu", "[0, 1]"]


def _request(messages: list[dict], **sampling: Any) -> dict:
    return {"messages": messages, "sampling": {"max_tokens": 12, "temperature": 0, **sampling}}


REQUESTS = {
    "text": _request([{"role": "user", "content": "Hello there"}]),
    "image": _request(user(image_part(64, 96))),
    "image+audio": _request(user(image_part(80, 48, seed=1), audio_part(1.2))),
}


async def _answer(runtime: Any, data: dict) -> tuple[str, dict]:
    handle = await runtime.dispatch(data)
    text, final = [], {}
    async for event in handle.stream():
        if event.stage == "decode":
            if event.final:
                final = event.data
            else:
                text.append(event.data)
    return "".join(text), final


async def _together(runtime: Any) -> dict[str, tuple[str, dict]]:
    answers: dict[str, tuple[str, dict]] = {}

    async def one(key: str) -> None:
        answers[key] = await _answer(runtime, REQUESTS[key])

    async with anyio.create_task_group() as tg:
        for key in REQUESTS:
            tg.start_soon(one, key)
    return answers


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_two_ranks_answer_the_tokens_of_one(short_tmp, anyio_backend):
    answers = {}
    for name, flags in (("tp1", ["--thinker.process", "thinker"]), ("tp2", TP2)):
        planned = plan_on_cpu(OmniPlugins(env={}), short_tmp / name, deploy=DEMO, flags=flags)
        async with planned.runtime() as runtime:
            alone = {key: await _answer(runtime, data) for key, data in REQUESTS.items()}
            assert await _together(runtime) == alone  # batched in the engine
            answers[name] = alone
    assert answers["tp2"] == answers["tp1"]
    for key, (text, final) in answers["tp2"].items():
        assert text and final["usage"]["completion_tokens"] == 12, key


@pytest.mark.slow
def test_a_killed_rank_fails_its_request_with_a_503_naming_it_and_the_group_comes_back():
    flags = [*TP2, "--preprocessing.factory.max_tokens", "4000"]
    with short_private_dir() as base:
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)
        with planned.serve() as live:
            client, runtime = live.client(timeout=120), live.runtime

            def chat(max_tokens: int) -> str:
                reply = client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": "Tell me a long story"}],
                    max_tokens=max_tokens,
                    temperature=0,
                )
                return reply.choices[0].message.content

            before = chat(8)
            failure: list[BaseException] = []

            def long_request() -> None:
                try:
                    chat(3500)
                except BaseException as exc:
                    failure.append(exc)

            worker = threading.Thread(target=long_request)
            worker.start()
            deadline = time.monotonic() + 60
            while not runtime.coordinator.inflight and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # generating: its steps run on both ranks
            os.kill(runtime.children["thinker_tp1"].proc.pid, signal.SIGKILL)
            worker.join(60)
            assert failure, "the request in flight was not failed"
            error = failure[0]
            assert isinstance(error, openai.APIStatusError) and error.status_code == 503
            assert "process thinker_tp1 was killed by SIGKILL" in str(error)
            deadline = time.monotonic() + 120
            while runtime.health()["status"] != "healthy" and time.monotonic() < deadline:
                time.sleep(0.2)
            health = runtime.health()["processes"]
            assert health["thinker_tp0"]["restarts"] == health["thinker_tp1"]["restarts"] == 1
            assert chat(8) == before  # the restarted group answers as the first one did


SPEECH_DEMO = DEMO.with_name("qwen3_omni_demo.toml")


def _spoken(messages: list[dict], voice: str) -> dict:
    data = _request(messages)
    return {**data, "modalities": ["text", "audio"], "voice": voice}


async def _speech(runtime: Any, data: dict) -> tuple[str, bytes]:
    handle = await runtime.dispatch(data)
    text, audio = [], []
    async for event in handle.stream():
        if not event.final:
            (text if event.stage == "decode" else audio).append(event.data)
    return "".join(text), b"".join(chunk.tobytes() for chunk in audio)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_split_thinker_feeds_the_talker_the_rows_of_a_whole_one(short_tmp, anyio_backend):
    """The talker reads rank 0's layer-0 and accept-layer rows: whole after the all-reduces."""
    spoken = {
        "text": _spoken([{"role": "user", "content": "Hello there"}], "ethan"),
        "media": _spoken(user(image_part(64, 96), audio_part(1.0)), "chelsie"),
    }
    fast = ["--talker_ar.factory.max_frames", "40"]
    answers = {}
    for name, flags in (("tp1", fast), ("tp2", [*fast, *TP2[2:]])):
        planned = plan_on_cpu(
            OmniPlugins(env={}), short_tmp / name, deploy=SPEECH_DEMO, flags=flags
        )
        async with planned.runtime() as runtime:
            answers[name] = {key: await _speech(runtime, data) for key, data in spoken.items()}
    assert answers["tp2"] == answers["tp1"]
    assert all(text and audio for text, audio in answers["tp1"].values())
