"""An agent framework nobody here wrote holds a spoken turn with ``/v1/realtime``.

pipecat's ``OpenAIRealtimeLLMService``, unchanged, is pointed at the qwen3-omni
CPU demo server and run in a pipecat pipeline with no transport: a processor at
its head plays the user's speech (espeak-ng, 24 kHz PCM16) in as
``InputAudioRawFrame``s, the server's VAD finds the turn and answers by itself,
and a processor at its tail collects what pipecat makes of the answer (its
``TTSAudioRawFrame``s and ``TTSTextFrame``s). Whatever pipecat sends in its own
way (its session.update, its headers, its ``?model=`` query) has to be taken as
the Realtime API documents it: an ``error`` event ends pipecat's session.

pipecat pins its own openai, websockets and pydantic ranges, so it lives in its
own environment: ``make test-agents`` (``.venv-agents``); elsewhere this skips.
The model is the tiny random checkpoint: what it says is meaningless.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
sf = pytest.importorskip("soundfile")
pytest.importorskip(
    "pipecat.services.openai.realtime.llm",
    reason="pipecat-ai is not installed here; it runs in its own environment: make test-agents",
)

from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    Frame,
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.openai.realtime import events  # noqa: E402
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from omni_core.plugins import OmniPlugins  # noqa: E402
from omni_core.serve.realtime.formats import resample  # noqa: E402
from omni_core.testing import plan_on_cpu, short_private_dir  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "examples" / "qwen3_omni_demo.toml"
KEY = "sk-agents-test"
RATE = 24000
CHUNK = RATE // 50 * 2  # 20 ms of PCM16, a transport's usual frame


@pytest.fixture(scope="module")
def server():
    with short_private_dir() as base:
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=DEMO)
        with planned.serve(api_key=KEY) as live:
            yield live


@pytest.fixture(scope="module")
def hello(tmp_path_factory) -> bytes:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    path = tmp_path_factory.mktemp("s") / "hello.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "Hello there"], check=True)
    samples, rate = sf.read(path, dtype="int16")
    return resample(samples, rate, RATE).astype("<i2").tobytes()


class Microphone(FrameProcessor):
    """The pipeline's head: what a transport would be, minus the network. It also keeps
    what travels upstream to it (pipecat sends the user's transcript and errors that way)."""

    def __init__(self) -> None:
        super().__init__()
        self.upstream: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.UPSTREAM:
            self.upstream.append(frame)
        await self.push_frame(frame, direction)

    async def speak(self, pcm: bytes) -> None:
        for i in range(0, len(pcm), CHUNK):
            frame = InputAudioRawFrame(audio=pcm[i : i + CHUNK], sample_rate=RATE, num_channels=1)
            await self.push_frame(frame)
            await asyncio.sleep(0)


class Speaker(FrameProcessor):
    """The pipeline's tail: every frame that reaches it, and when the answer has ended."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []
        self.answered = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            self.frames.append(frame)
            if isinstance(frame, LLMFullResponseEndFrame):
                self.answered.set()
        await self.push_frame(frame, direction)


def _idle(server) -> bool:
    """Every stage of every process and its engine: nothing running, nothing waiting."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{server.url}/health") as answer:
            health = json.load(answer)
        busy = [
            (name, stage)
            for name, info in health["processes"].items()
            for stage, depth in info["queue"].items()
            if any(depth.values())
        ]
        if not busy and health["inflight"] == 0:
            return True
        time.sleep(0.2)
    return False


def test_pipecat_holds_a_spoken_turn_through_server_vad(server, hello) -> None:
    llm = OpenAIRealtimeLLMService(
        api_key=KEY,
        base_url=server.url.replace("http://", "ws://", 1) + "/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(
            model="tiny",
            system_instruction="You are a helpful assistant. Answer briefly.",
            session_properties=events.SessionProperties(
                max_output_tokens=12,
                audio=events.AudioConfiguration(
                    input=events.AudioInput(
                        transcription=events.InputAudioTranscription(),
                        turn_detection=events.TurnDetection(silence_duration_ms=400),
                    ),
                    output=events.AudioOutput(voice="chelsie"),  # one of the demo's speakers
                ),
            ),
        ),
    )
    finished: list[Any] = []

    @llm.event_handler("on_conversation_item_updated")
    async def _updated(service: Any, item_id: str, item: Any) -> None:
        if item is not None and getattr(item, "role", None) == "assistant":
            finished.append(item)

    mic, speaker = Microphone(), Speaker()
    worker = PipelineWorker(
        Pipeline([mic, llm, speaker]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    errors: list[Any] = []

    @worker.event_handler("on_pipeline_error")
    async def _error(worker: Any, frame: Any) -> None:
        errors.append(frame)

    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: Any, frame: Any) -> None:
        started.set()

    async def talk() -> None:
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.create_task(runner.run())
        try:
            async with asyncio.timeout(120):
                await started.wait()
                silence = bytes(RATE // 5 * 2)  # 200 ms
                await mic.speak(silence + hello + silence * 8)
                while not speaker.answered.is_set() and not errors:
                    await asyncio.sleep(0.1)
                # the transcript of the user's turn runs beside the answer
                while not any(isinstance(f, TranscriptionFrame) for f in mic.upstream):
                    if errors:
                        break
                    await asyncio.sleep(0.1)
                await worker.queue_frame(EndFrame())
                await running
        finally:
            if not running.done():
                await worker.cancel()
                await running

    asyncio.run(talk())

    assert not errors, [str(e) for e in errors]
    kinds = [type(f) for f in speaker.frames]
    audio = b"".join(f.audio for f in speaker.frames if isinstance(f, TTSAudioRawFrame))
    assert len(audio) > RATE // 10 and len(audio) % 2 == 0
    assert {f.sample_rate for f in speaker.frames if isinstance(f, TTSAudioRawFrame)} == {RATE}
    order = [LLMFullResponseStartFrame, TTSStartedFrame, TTSAudioRawFrame, TTSStoppedFrame]
    firsts = [kinds.index(k) for k in order]
    assert firsts == sorted(firsts)
    assert kinds.index(TTSStoppedFrame) < kinds.index(LLMFullResponseEndFrame)
    said = "".join(f.text for f in speaker.frames if isinstance(f, TTSTextFrame))
    assert said
    # pipecat's transcript deltas add up to the transcript of the item response.done closed
    transcripts = [c.transcript for item in finished for c in item.content or [] if c.transcript]
    assert transcripts == [said]
    heard = [f for f in mic.upstream if isinstance(f, TranscriptionFrame)]
    assert len(heard) == 1
    assert _idle(server)
