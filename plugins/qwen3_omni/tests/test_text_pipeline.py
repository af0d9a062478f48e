"""qwen3-omni-text through the real runtime: one process or three, media or none, batched.

The built-in demo deploy file (tiny preset, seeded dummy weights, CPU) is
resolved and planned as ``omni serve`` does. Text deltas come from the
decode stage's stream; greedy answers are token-exact functions of the
prompt and the weights, so any difference in placement, batching or
transport shows up as different text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

from media_samples import audio_part, image_part, user

from omni_core.plugins import OmniPlugins
from omni_core.testing import plan_on_cpu

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_omni_text_demo.toml"
SPLIT = [  # three processes: front (preprocessing, decode), encoders, thinker
    *("--image_encoder.process", "encoders", "--audio_encoder.process", "encoders"),
    *("--mm_aggregate.process", "lm", "--thinker.process", "lm"),
]

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _request(messages: list[dict], **sampling: Any) -> dict:
    return {"messages": messages, "sampling": {"max_tokens": 10, "temperature": 0, **sampling}}


REQUESTS = {
    "text": _request([{"role": "user", "content": "Hello there"}]),
    "image": _request(user(image_part(64, 96))),
    "image+audio": _request(user(image_part(80, 48, seed=1), audio_part(1.2))),
    "sampled": _request(user(audio_part(0.8)), temperature=0.9, top_p=0.8, seed=7),
}


async def _answer(runtime: Any, data: dict) -> tuple[str, dict]:
    handle = await runtime.dispatch(data)
    text, final = [], {}
    async for event in handle.stream():
        if event.stage != "decode":
            continue
        if event.final:
            final = event.data
        else:
            text.append(event.data)
    return "".join(text), final


def _planned(base: Path, *flags: str):
    return plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO, flags=flags)


@pytest.mark.slow
async def test_one_process_and_three_give_the_same_answers(short_tmp):
    answers = {}
    for layout, flags in (("one", []), ("three", SPLIT)):
        planned = _planned(short_tmp / layout, *flags)
        assert len(planned.plan.processes) == (1 if layout == "one" else 3)
        async with planned.runtime() as runtime:
            answers[layout] = {
                name: await _answer(runtime, data) for name, data in REQUESTS.items()
            }
    assert answers["one"] == answers["three"]
    for name, (text, final) in answers["one"].items():
        assert text, name
        assert final["finish_reason"] == "length"
        assert final["usage"]["completion_tokens"] == 10
    prompts = {name: final["usage"]["prompt_tokens"] for name, (_, final) in answers["one"].items()}
    # The 64x96 image is 6 tokens (4x6 patches merged 2x2) plus its start/end markers.
    assert prompts["image"] > prompts["text"]
    assert prompts["image+audio"] > prompts["image"]


@pytest.mark.slow  # ~7 s; test_talker and test_thinker_model check batched == alone in make test
async def test_concurrent_requests_batch_and_each_equals_its_solo_run(short_tmp):
    async with _planned(short_tmp / "batch").runtime() as runtime:
        solo = {name: await _answer(runtime, data) for name, data in REQUESTS.items()}
        together: dict[str, Any] = {}

        async def one(name: str) -> None:
            together[name] = await _answer(runtime, REQUESTS[name])

        async with anyio.create_task_group() as tg:
            for name in REQUESTS:
                tg.start_soon(one, name)
    assert together == solo


async def test_a_stop_string_ends_the_answer_before_it_and_stops_the_thinker(short_tmp):
    async with _planned(short_tmp / "stop").runtime() as runtime:
        text, _ = await _answer(runtime, _request(user(image_part())))
        stop = text[3:6]
        cut, final = await _answer(runtime, _request(user(image_part()), stop=[stop]))
        assert cut == text[: text.index(stop)]
        assert final["finish_reason"] == "stop"
        assert final["usage"]["completion_tokens"] < 10
        await _idle(runtime)


@pytest.mark.slow  # a multi-process run of ~9 s (make test-all runs it)
async def test_an_aborted_request_stops_in_every_stage(short_tmp):
    flags = ["--preprocessing.factory.max_tokens", "4000", *SPLIT]
    async with _planned(short_tmp / "abort", *flags).runtime() as runtime:
        data = _request(user(image_part(), audio_part()), max_tokens=4000)
        handle = await runtime.dispatch(data)
        async for event in handle.stream():
            if event.stage == "decode" and not event.final:
                break  # the first text delta: the thinker is generating
        await runtime.abort(handle, "the client went away")
        await _idle(runtime)


async def _idle(runtime: Any) -> None:
    """Wait until no stage of any process runs a request (heartbeats report it)."""
    with anyio.fail_after(15):
        while True:
            await anyio.sleep(0.3)
            stats = runtime.coordinator.stage_stats
            busy = {
                (process, stage)
                for process, stages in stats.items()
                for stage, counts in stages.items()
                if counts["running"] or counts["waiting"]
            }
            if stats and not busy:
                return
