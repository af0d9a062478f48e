"""The Qwen3-Omni thinker on SGLang equals it on the torch backend (``make test-sglang``).

Opt-in: these need the SGLang environment (``make sglang-env``) and run only
under ``make test-sglang`` (``OMNI_TEST_SGLANG=1``). Same demo deploy files,
same seeded weights (omni writes its dummy thinker out for SGLang), greedy:
answers must be equal token for token, alone and eight at once, and the
talker reading SGLang's hidden states must speak the same audio.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

if not os.environ.get("OMNI_TEST_SGLANG"):
    pytest.skip("the SGLang backend's tests run under `make test-sglang`", allow_module_level=True)
pytest.importorskip("sglang")

from media_samples import audio_part, image_part, user

from omni_core.plugins import OmniPlugins
from omni_core.testing import plan_on_cpu

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SGLANG = ("--thinker.engine.backend", "sglang")
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _request(messages: list[dict], **sampling: Any) -> dict:
    return {"messages": messages, "sampling": {"max_tokens": 10, "temperature": 0, **sampling}}


REQUESTS = {
    "text": _request([{"role": "user", "content": "Hello there"}]),
    "image": _request(user(image_part(64, 96))),
    "audio": _request(user(audio_part(1.0))),
    "image+audio": _request(user(image_part(80, 48, seed=1), audio_part(1.2))),
}


async def _answer(runtime: Any, data: dict) -> tuple[str, list, dict]:
    handle = await runtime.dispatch(data)
    text, audio, final = [], [], {}
    async for event in handle.stream():
        if event.stage == "decode":
            if event.final:
                final = event.data
            else:
                text.append(event.data)
        elif event.stage == "code2wav" and not event.final:
            audio.append(event.data)
    return "".join(text), audio, final


async def _answers(base: Path, deploy: str, requests: dict, *flags: str) -> dict:
    planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=EXAMPLES / deploy, flags=flags)
    out: dict[str, Any] = {}
    async with planned.runtime() as runtime:
        for name, data in requests.items():
            out[name] = await _answer(runtime, data)
        together: dict[str, Any] = {}

        async def one(key: str) -> None:
            together[key] = await _answer(runtime, requests[key.split("#")[0]])

        async with anyio.create_task_group() as tg:  # eight at once
            for copy in range(8 // len(requests) or 1):
                for name in requests:
                    tg.start_soon(one, f"{name}#{copy}")
        out["together"] = together
        out["idle"] = await _idle(runtime)
    return out


async def _idle(runtime: Any) -> bool:
    """No stage of any process runs a request, SGLang's scheduler included."""
    with anyio.fail_after(20):
        while True:
            await anyio.sleep(0.3)
            stats = runtime.coordinator.stage_stats
            busy = [
                (process, stage)
                for process, stages in stats.items()
                for stage, counts in stages.items()
                if any(
                    counts.get(k)
                    for k in ("running", "waiting", "engine_running", "engine_waiting")
                )
            ]
            if stats and not busy:
                return True


async def test_text_and_media_answers_equal_the_torch_backend_alone_and_eight_at_once(short_tmp):
    deploy = "qwen3_omni_text_demo.toml"
    torch_side = await _answers(short_tmp / "t", deploy, REQUESTS)
    sglang_side = await _answers(short_tmp / "s", deploy, REQUESTS, *SGLANG)
    for name in REQUESTS:
        assert sglang_side[name][0] == torch_side[name][0], name
        assert sglang_side[name][2]["usage"] == torch_side[name][2]["usage"], name
        assert sglang_side[name][2]["finish_reason"] == "length"
    for key, (text, _, _) in sglang_side["together"].items():
        assert text == torch_side[key.split("#")[0]][0], key
    assert sglang_side["idle"]


async def test_speech_from_the_sglang_thinker_equals_the_torch_backends(short_tmp):
    spoken = {
        "text": {
            **_request([{"role": "user", "content": "Hello there"}], max_tokens=8),
            "modalities": ["text", "audio"],
            "voice": "ethan",
        },
        "media": {
            **_request(user(image_part(64, 96), audio_part(1.0)), max_tokens=8),
            "modalities": ["text", "audio"],
            "voice": "chelsie",
        },
    }
    fast = ("--talker_ar.factory.max_frames", "30")
    deploy = "qwen3_omni_demo.toml"
    torch_side = await _answers(short_tmp / "t", deploy, spoken, *fast)
    sglang_side = await _answers(short_tmp / "s", deploy, spoken, *fast, *SGLANG)
    for name in spoken:
        text, audio, _ = sglang_side[name]
        assert text == torch_side[name][0], name
        assert audio, name
        np.testing.assert_allclose(
            np.concatenate(audio), np.concatenate(torch_side[name][1]), atol=1e-4
        )
    assert sglang_side["idle"]


async def test_stop_strings_and_aborts_leave_nothing_running_in_sglang(short_tmp):
    planned = plan_on_cpu(
        OmniPlugins(env={}),
        short_tmp / "a",
        deploy=EXAMPLES / "qwen3_omni_text_demo.toml",
        flags=[*SGLANG, "--preprocessing.factory.max_tokens", "4000"],
    )
    async with planned.runtime() as runtime:
        text, _, _ = await _answer(runtime, REQUESTS["image"])
        stop = text[3:6]
        cut, _, final = await _answer(runtime, _request(user(image_part(64, 96)), stop=[stop]))
        assert cut == text[: text.index(stop)]
        assert final["finish_reason"] == "stop"
        assert final["usage"]["completion_tokens"] < 10
        handle = await runtime.dispatch(_request(user(image_part(), audio_part()), max_tokens=4000))
        async for event in handle.stream():
            if event.stage == "decode" and not event.final:
                break  # the thinker is generating on SGLang
        await runtime.abort(handle, "the client went away")
        assert await _idle(runtime)
