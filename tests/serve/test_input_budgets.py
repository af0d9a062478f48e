"""Text budgets through the real server: an oversized text is a 400 naming its limit, and
a legitimately large one is tokenized off the stage's event loop (no restart).

The server is ``omni serve`` on the built-in Qwen3-TTS demo: a 6 MB ``input``
once held its preprocessing stage's loop for seconds while it was tokenized,
the heartbeat stopped, and the process was killed as hung.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from serve_helpers import OmniServe, raw

pytest.importorskip("omni_qwen3_tts")

DEMO = Path(__file__).resolve().parents[2] / "examples" / "qwen3_tts_demo.toml"
SIX_MB = "hello world, how are you? " * 240_000


def _serve(base: Path, *flags: str) -> Iterator[OmniServe]:
    served = OmniServe(base, DEMO, flags)
    try:
        yield served
    finally:
        assert served.stop() == 0, served.stderr()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniServe]:
    yield from _serve(tmp_path_factory.mktemp("budgets"), "--server.max_chat_text_chars", "50")


def restarts(server: OmniServe) -> dict[str, int]:
    health = raw("GET", f"{server.url}/health").json()
    return {name: p["restarts"] for name, p in health["processes"].items()}


def speak(server: OmniServe, text: str, **fields):
    body = {"input": text, "voice": "serena", "max_frames": 2, **fields}
    return raw("POST", f"{server.url}/v1/audio/speech", json_body=body, timeout=120)


def test_a_six_megabyte_input_is_a_400_naming_the_limit_and_nothing_restarts(server):
    before = restarts(server)
    started = time.perf_counter()
    reply = speak(server, SIX_MB)
    elapsed = time.perf_counter() - started
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "input" and error["code"] == "string_above_max_length"
    assert "4096 (server.max_input_chars)" in error["message"]
    assert f"{len(SIX_MB)} characters" in error["message"]
    assert elapsed < 5, elapsed  # counted, never tokenized: well under a second unloaded
    for field in ("instructions", "ref_text"):
        reply = speak(server, "Hello.", **{field: "x" * 4097})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == field
    assert speak(server, "Hello.").status_code == 200
    assert restarts(server) == before


def test_every_speech_route_counts_the_same_characters(server):
    batch = raw(
        "POST",
        f"{server.url}/v1/audio/speech/batch",
        json_body={"items": [{"input": "x" * 5000, "voice": "serena"}]},
    )
    assert batch.status_code == 200, batch.text
    item = batch.json()["data"][0]
    assert item["status"] == 400 and "server.max_input_chars" in item["error"]["message"]


def test_chat_text_over_its_budget_is_refused_before_submission(short_tmp):
    import omni_test_speech as ts

    from omni_core.plugins import OmniPlugins
    from omni_core.testing import LiveServer, plan_on_cpu

    plugins = OmniPlugins(env={})
    plugins.register(ts, ts.HERE)
    flags = ["--server.max_chat_text_chars", "50"]
    planned = plan_on_cpu(
        plugins, short_tmp, pipeline="t-chat", flags=flags, policy=None, plugin_modules=[ts.HERE]
    )
    chat = LiveServer(planned).start()
    try:
        url = f"{chat.url}/v1/chat/completions"
        parts = [{"type": "text", "text": "a" * 30}, {"type": "text", "text": "b" * 21}]
        over = raw("POST", url, json_body={"messages": [{"role": "user", "content": parts}]})
        assert over.status_code == 400, over.text
        error = over.json()["error"]
        assert error["param"] == "messages"
        assert (
            "51 characters" in error["message"] and "server.max_chat_text_chars" in error["message"]
        )
        within = {"messages": [{"role": "user", "content": "a" * 50}]}
        assert raw("POST", url, json_body=within).status_code == 200
    finally:
        chat.stop()


@pytest.mark.slow
def test_a_large_input_the_operator_allows_is_tokenized_off_the_loop(short_tmp):
    """With the character limit raised, 6 MB of text reaches the stage, whose
    tokenizer takes seconds over it. The heartbeat (every 0.3 s, a 1.5 s timeout)
    must keep beating meanwhile, and a small request in parallel must be served."""
    flags = (
        "--server.max_input_chars",
        "100000000",
        "--preprocessing.factory.max_input_tokens",
        "1000000",
        "--runtime.heartbeat_timeout",
        "1.5",
    )
    for served in _serve(short_tmp, *flags):
        before = restarts(served)
        with ThreadPoolExecutor(2) as pool:
            big = pool.submit(speak, served, SIX_MB[:1_500_000])
            time.sleep(0.5)
            small = speak(served, "Hello.")
            reply = big.result()
        assert small.status_code == 200, small.text
        assert reply.status_code == 400, reply.text
        assert "factory.max_input_tokens" in reply.json()["error"]["message"]
        assert restarts(served) == before, served.stderr()
