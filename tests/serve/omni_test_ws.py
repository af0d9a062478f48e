"""A deterministic CPU speech pipeline for the WebSocket tests (a plugin module).

``t-ws-speech`` (api speech) has one stage, ``speak``, entry, terminal and
audio stage at once: each character of ``input`` becomes a short tone whose
pitch depends on the character and the request's ``seed``, so the audio of a
text is fixed by the text and the seed, and differs when either does. It
streams one chunk per :data:`CHARS_PER_CHUNK` characters. Extra request
fields: ``test_samples_per_char`` (how long each character sounds),
``test_chunk_delay`` (seconds between chunks: a slow model) and
``test_refuse`` (a segment containing this text is refused, as a stage
refuses a request: HTTP 400). Registered in-process by the tests and, by
module name, in the children the runtime spawns.
"""

from __future__ import annotations

import math
from typing import Any

import anyio

from omni_core import PipelineConfig, RequestError, StageConfig, hookimpl

HERE = "omni_test_ws"
SAMPLE_RATE = 24000
SAMPLES_PER_CHAR = 240  # 10 ms
CHARS_PER_CHUNK = 4
VOICES = ("alice", "bob")


def tone(text: str, seed: int, samples_per_char: int) -> Any:
    """``text`` as float32 samples: a tone per character, pitch from the character and seed."""
    import numpy as np

    t = np.arange(samples_per_char) / SAMPLE_RATE
    parts = [
        (0.3 * np.sin(2 * math.pi * (200 + (ord(char) * 7 + seed * 13) % 600) * t)) for char in text
    ]
    return np.concatenate(parts).astype(np.float32)


class Speak:
    async def run(self, request):
        data = request.data
        text = data["input"]
        if data.get("voice") not in (None, *VOICES):
            raise RequestError(f"unknown voice {data['voice']!r}; voices: {', '.join(VOICES)}")
        refuse = data.get("test_refuse")
        if refuse and refuse in text:
            raise RequestError(f"this test pipeline refuses text with {refuse!r}")
        seed = int(data.get("seed") or 0)
        per_char = int(data.get("test_samples_per_char") or SAMPLES_PER_CHAR)
        delay = float(data.get("test_chunk_delay") or 0)
        for start in range(0, len(text), CHARS_PER_CHUNK):
            if start and delay:
                await anyio.sleep(delay)
            await request.emit(tone(text[start : start + CHARS_PER_CHUNK], seed, per_char))
        return {"finish_reason": "stop"}


def create() -> Any:
    return Speak()


class WsSpeechPipeline(PipelineConfig):
    pipeline_name = "t-ws-speech"
    description = "test speech pipeline: a tone per character, seeded"
    entry_stage = "speak"
    default_placement_policy = "cpu"
    api = ("speech",)
    audio_stage = "speak"
    sample_rate = SAMPLE_RATE

    @classmethod
    def default_stages(cls) -> list[StageConfig]:
        return [
            StageConfig(name="speak", factory_path=f"{HERE}:create", process="p", terminal=True)
        ]


@hookimpl
def omni_register_pipelines() -> list[type[PipelineConfig]]:
    return [WsSpeechPipeline]
