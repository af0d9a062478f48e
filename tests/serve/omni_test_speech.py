"""Two small CPU pipelines for the server tests (a plugin module).

``t-speech`` (api speech and chat): ``prep`` checks the voice and finds the
text, ``synth`` streams sine-wave chunks to ``audio``, the terminal audio
stage, which runs in another process so that numpy chunks cross a transport.
``t-chat`` (api chat): ``think`` writes a reply, ``text`` streams it word by
word (a word is a "token": it honours ``sampling.max_tokens`` and
``sampling.stop`` and reports usage), and ``talker`` (routed to only when
audio is asked for) streams sine audio. ``test_echo: true`` (an extra field)
makes the reply the JSON of the ``sampling`` dict the entry stage received;
``test_usage`` is reported as the text stage's usage instead of its counts.
``test_raise: true`` makes ``think`` raise ZeroDivisionError (a bug in a stage),
``test_list: true`` makes ``text`` emit lists instead of str (a broken contract).
Registered in-process by the tests and, by module name, in the children the
runtime spawns.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import anyio

from omni_core import PipelineConfig, RequestError, StageConfig, hookimpl

HERE = "omni_test_speech"
SAMPLE_RATE = 24000
CHUNK_SAMPLES = 1200  # 50 ms
VOICES = {"alice": 220.0, "bob": 330.0}


def sine(frequency: float, index: int, samples: int = CHUNK_SAMPLES) -> Any:
    import numpy as np

    t = (np.arange(samples) + index * samples) / SAMPLE_RATE
    return (0.5 * np.sin(2 * math.pi * frequency * t)).astype(np.float32)


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        return " ".join(p.get("text", "") for p in content or [] if p.get("type") == "text")
    return ""


async def _maybe_wait(data: dict[str, Any]) -> None:
    """``test_delay`` (an extra sampling field) makes a request slow on purpose."""
    delay = float(data.get("test_delay") or 0)
    if delay:
        await anyio.sleep(delay)


class Prep:
    async def run(self, request):
        data = request.data
        voice = data.get("voice") or "alice"
        if voice not in VOICES:
            raise RequestError(f"unknown voice {voice!r}; voices: {', '.join(sorted(VOICES))}")
        text = (
            data["input"] if request.params["api"] == "speech" else last_user_text(data["messages"])
        )
        if not text.strip():
            raise RequestError("there is no text to speak")
        await _maybe_wait(data)
        return {
            "text": text,
            "voice": voice,
            "chunks": max(1, len(text.split())),
            "chunk_delay": float(data.get("test_chunk_delay") or 0),
            # ``test_chunk_seconds``: longer chunks, which no scheduling delay underruns
            "chunk_samples": round(float(data.get("test_chunk_seconds") or 0) * SAMPLE_RATE)
            or CHUNK_SAMPLES,
        }


class Synth:
    """Streams one sine chunk (50 ms unless asked otherwise) per word of the text to audio."""

    async def run(self, request):
        frequency = VOICES[request.data["voice"]]
        for index in range(request.data["chunks"]):
            if index and request.data["chunk_delay"]:  # ``test_chunk_delay``: a slow stream
                await anyio.sleep(request.data["chunk_delay"])
            await request.emit(sine(frequency, index, request.data["chunk_samples"]))
        return {"chunks": request.data["chunks"]}


class Audio:
    """The terminal audio stage: passes chunks to the client, returns the sample count.

    Its usage counts a chunk as a token (the pipeline has no text stage, so
    this stage's usage is the request's).
    """

    async def run(self, request):
        samples = chunks = 0
        async for chunk in request.stream:
            samples += len(chunk)
            chunks += 1
            await request.emit(chunk)
        return {"samples": samples, "usage": {"prompt_tokens": 0, "completion_tokens": chunks}}


class Think:
    async def run(self, request):
        data = request.data
        text = last_user_text(data["messages"])
        if not text.strip():
            raise RequestError("the last user message has no text")
        await _maybe_wait(data)
        if data.get("test_raise"):
            return {"reply": 1 / 0}
        sampling, echo = data["sampling"], bool(data.get("test_echo"))
        return {  # an echo is neither capped nor cut (it holds the stop strings)
            "reply": json.dumps(sampling, sort_keys=True) if echo else f"You said: {text}",
            "prompt_tokens": len(text.split()),
            "max_tokens": None if echo else sampling["max_tokens"],
            "stop": [] if echo else sampling["stop"],
            "usage": data.get("test_usage"),  # what text reports instead of its own counts
            "modalities": data.get("modalities") or ["text"],
            "voice": (data.get("audio") or {}).get("voice") or "alice",
            "as_list": bool(data.get("test_list")),
        }


class Text:
    """Streams the reply a word (a "token") at a time, up to ``max_tokens``, and
    ends it before the first stop string, which it leaves out (as OpenAI)."""

    async def run(self, request):
        data = request.data
        reply = data["reply"]
        hits = [reply.find(stop) for stop in data["stop"] if stop in reply]
        text = reply[: min(hits)] if hits else reply
        words = text.split(" ")
        cap = data["max_tokens"] or len(words)
        for index, word in enumerate(words[:cap]):
            delta = word if index == 0 else f" {word}"
            await request.emit([delta] if data.get("as_list") else delta)
        usage = data["usage"] or {
            "prompt_tokens": data["prompt_tokens"],
            "completion_tokens": min(cap, len(words)),
        }
        return {"finish_reason": "length" if cap < len(words) else "stop", "usage": usage}


class Talker:
    """Its usage is not the request's: the pipeline's text stage counts. Like Qwen3-Omni's
    talker it ends with "stop" (it spoke all the text it got), even after a capped text."""

    async def run(self, request):
        frequency = VOICES.get(request.data["voice"], 220.0)
        count = len(request.data["reply"].split())
        for index in range(count):
            await request.emit(sine(frequency, index))
        usage = {"prompt_tokens": 1000, "completion_tokens": 1000}
        return {"chunks": count, "usage": usage, "finish_reason": "stop"}


def create(kind: str, start_delay: float = 0.0, start_gate: str | None = None) -> Any:
    """``factory.start_delay`` makes the stage slow to start (signals during start-up);
    ``factory.start_gate`` holds its start until that file exists (a test's own moment,
    60 s at most)."""
    stages = {"prep": Prep, "synth": Synth, "audio": Audio, "think": Think, "text": Text}
    stage = {**stages, "talker": Talker}[kind]()
    if start_delay or start_gate:

        async def start() -> None:
            await anyio.sleep(start_delay)
            with anyio.fail_after(60):
                while start_gate is not None and not Path(start_gate).exists():
                    await anyio.sleep(0.05)

        stage.start = start
    return stage


def route_chat(result: dict[str, Any]) -> list[str]:
    return ["text", "talker"] if "audio" in result["modalities"] else ["text"]


def _stage(name: str, process: str, **kw: Any) -> StageConfig:
    return StageConfig(
        name=name,
        factory_path=f"{HERE}:create",
        author_kwargs={"kind": name},
        process=process,
        **kw,
    )


class SpeechPipeline(PipelineConfig):
    pipeline_name = "t-speech"
    description = "test speech pipeline: sine waves, one chunk per word"
    entry_stage = "prep"
    default_placement_policy = "cpu"
    api = ("speech", "chat")
    audio_stage = "audio"
    sample_rate = SAMPLE_RATE

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [
            _stage("prep", "front", next="synth"),
            _stage("synth", "front", next="audio", stream_to=["audio"]),
            _stage("audio", "back", terminal=True),
        ]


class ChatPipeline(PipelineConfig):
    pipeline_name = "t-chat"
    description = "test chat pipeline: echoes the prompt, optionally as sine audio"
    entry_stage = "think"
    default_placement_policy = "cpu"
    api = ("chat",)
    text_stage = "text"
    audio_stage = "talker"
    sample_rate = SAMPLE_RATE

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [
            _stage("think", "p", next=["text", "talker"], route_fn=f"{HERE}:route_chat"),
            _stage("text", "p", terminal=True),
            _stage("talker", "p", terminal=True),
        ]


@hookimpl
def omni_register_pipelines() -> list[type[PipelineConfig]]:
    return [SpeechPipeline, ChatPipeline]
