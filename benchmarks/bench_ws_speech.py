"""Time to first audio over ``/v1/audio/speech/stream`` while an LLM is still writing.

Run: ``python benchmarks/bench_ws_speech.py [--frames 16] [--rate 20] [--repeats 2]``
(a few minutes on two CPU cores; ``--smoke``: the tiny preset's sizes, 4 frames, one
repeat, to check that the script still runs).

Why: the WebSocket exists so that speech starts while the text is still
being written. This measures by how much, on Qwen3-TTS at its real 0.6B size
(the CustomVoice checkpoint that ``bench_qwen3_tts.py`` writes: the
release's configs, dummy weights), served in-process by
``omni_core.harness`` on this machine's CPU, for an answer whose text
arrives at a typical LLM pace (``--rate`` tokens per second, 4 characters a
token). Every clock starts when the LLM writes its first token:

* ``ws, as written``: the pieces go over the WebSocket as they are written;
  the first sentence is spoken as soon as it is complete;
* ``ws, at the end``: the same WebSocket, the whole text sent once written;
* ``POST, at the end``: one streamed ``POST /v1/audio/speech`` of the whole
  text once written (what a client without the WebSocket does).

Every request makes exactly ``--frames`` frames (EOS is banned until then and
``max_frames`` caps it there), so a sentence costs the same whatever its
text; the POST of the whole text is one request of that size, so only its
first-audio figure compares.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from omni_core.sigterm import run_script

HERE = Path(__file__).resolve().parent
TEXT = (
    "Sure, here is a short answer to your question. The weather today is mild, "
    "with a light breeze from the west and a few clouds later on. "
    "If you go out this evening, take a jacket just in case."
)
CHARS_PER_TOKEN = 4


@dataclass
class Timing:
    first_audio: float  # seconds from the first token
    text_end: float  # when the whole text had been written
    ready: float  # when the server had the text it speaks first (a sentence, or all of it)
    done: float  # the last audio
    audio_seconds: float

    @property
    def after_text(self) -> float:
        return self.first_audio - self.text_end

    @property
    def synthesis(self) -> float:
        """From the first text the server could speak to its first audio: the model's share."""
        return self.first_audio - self.ready


def deploy_file(root: Path, frames: int) -> Path:
    """A deploy file serving the 0.6B checkpoint at ``root`` on the CPU, ``frames`` per request."""
    path = root / "deploy.toml"
    path.write_text(
        f'pipeline = "qwen3-tts"\nmodel_path = "{root / "ckpt"}"\n'
        '[server]\nserved_model_name = "qwen3-tts-0.6b"\n'
        '[placement]\npolicy = "cpu"\n'
        '[stages.tts_engine.factory]\nload_format = "dummy"\n'
        "[stages.tts_engine.engine]\nmax_running_requests = 4\nmax_total_tokens = 8192\n"
        '[stages.vocoder.factory]\nload_format = "dummy"\n'
        f"[stages.preprocessing.factory]\nmax_frames = {frames}\n"
    )
    return path


def pieces(text: str) -> list[str]:
    return [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]


def first_sentence_token(tokens: list[str]) -> int:
    """The token after which the server's segmenter has the first sentence."""
    from omni_core.serve.speech.segmenter import Segmenter

    segmenter = Segmenter()
    for index, token in enumerate(tokens):
        if segmenter.feed(token):
            return index
    return len(tokens) - 1


async def over_websocket(url: str, as_written: bool, rate: float, seed: int) -> Timing:
    from websockets.asyncio.client import connect

    tokens = pieces(TEXT)
    writing = len(tokens) / rate
    ready = (first_sentence_token(tokens) + 1) / rate if as_written else writing
    async with connect(url) as ws:
        config = {"type": "session.config", "voice": "serena", "seed": seed}
        await ws.send(json.dumps(config))
        json.loads(await ws.recv())  # session.created
        first: float | None = None
        samples = 0
        start = time.perf_counter()

        async def write() -> None:
            if as_written:
                for index, token in enumerate(tokens):
                    await asyncio.sleep(max(0.0, start + index / rate - time.perf_counter()))
                    await ws.send(json.dumps({"type": "input.text", "text": token}))
            else:
                await asyncio.sleep(writing)
                await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
            await ws.send(json.dumps({"type": "input.done"}))

        writer = asyncio.ensure_future(write())
        async for message in ws:
            if isinstance(message, bytes):
                first = first or time.perf_counter() - start
                samples += len(message) // 2
            elif json.loads(message)["type"] == "error":
                raise RuntimeError(message)
        await writer
        done = time.perf_counter() - start
    assert first is not None, "no audio came"
    return Timing(first, writing, ready, done, samples / 24000)


def over_post(base: str, rate: float, seed: int) -> Timing:
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=600)
    writing = len(pieces(TEXT)) / rate
    start = time.perf_counter()
    time.sleep(writing)
    first: float | None = None
    samples = 0
    with client.audio.speech.with_streaming_response.create(
        model="qwen3-tts-0.6b",
        input=TEXT,
        voice="serena",
        response_format="pcm",
        extra_body={"stream": True, "seed": seed},
    ) as response:
        for chunk in response.iter_bytes():
            first = first or time.perf_counter() - start
            samples += len(chunk) // 2
    assert first is not None, "no audio came"
    return Timing(first, writing, writing, time.perf_counter() - start, samples / 24000)


def report(rows: dict[str, list[Timing]], args: argparse.Namespace) -> None:
    print(
        f"\ntext: {len(TEXT)} characters in {len(pieces(TEXT))} tokens at {args.rate:g} tokens/s "
        f"({len(pieces(TEXT)) / args.rate:.2f} s to write); {args.frames} frames "
        f"({args.frames / 12.5:.2f} s of audio) per request; median of {args.repeats}"
    )
    head = (
        f"{'':<18}{'text ready':>11}{'first audio':>13}{'synthesis':>11}"
        f"{'after text end':>16}{'last audio':>12}{'audio':>8}"
    )
    print(head)
    print("-" * len(head))
    for name, timings in rows.items():

        def median(attr: str, runs: list[Timing] = timings) -> float:
            return statistics.median(getattr(t, attr) for t in runs)

        print(
            f"{name:<18}{median('ready'):>10.2f}s{median('first_audio'):>12.2f}s"
            f"{median('synthesis'):>10.2f}s{median('after_text'):>15.2f}s"
            f"{median('done'):>11.2f}s{median('audio_seconds'):>7.2f}s"
        )
    print(
        "(seconds from the LLM's first token; text ready: when the server had what it speaks "
        "first;\n synthesis: first audio - text ready; after text end < 0: speech began before)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=16, help="frames per request (12.5 a s)")
    parser.add_argument("--rate", type=float, default=20.0, help="LLM tokens per second")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in the stages")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one repeat: checks the script runs (make test)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.frames, args.repeats, args.rate = 4, 1, 200.0
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the stage process inherits it
    sys.path.insert(0, str(HERE))
    from bench_qwen3_tts import write_configs

    from omni_core.harness import plan_on_cpu, short_private_dir
    from omni_core.plugins import OmniPlugins

    with tempfile.TemporaryDirectory(prefix="ws-bench-") as tmp, short_private_dir() as base:
        root = Path(tmp)
        write_configs(root / "ckpt", args.frames, "tiny" if args.smoke else "0.6B")
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=deploy_file(root, args.frames))
        started = time.perf_counter()
        with planned.serve() as live:
            size = "tiny" if args.smoke else "0.6B"
            print(
                f"Qwen3-TTS {size} (dummy weights) served in {time.perf_counter() - started:.1f} s"
            )
            url = live.url.replace("http://", "ws://", 1) + "/v1/audio/speech/stream"
            over_post(live.url, 1e9, seed=0)  # warm-up
            rows: dict[str, list[Timing]] = {
                "ws, as written": [],
                "ws, at the end": [],
                "POST, at the end": [],
            }
            for repeat in range(args.repeats):
                seed = 100 + repeat
                rows["ws, as written"].append(
                    asyncio.run(over_websocket(url, True, args.rate, seed))
                )
                rows["ws, at the end"].append(
                    asyncio.run(over_websocket(url, False, args.rate, seed))
                )
                rows["POST, at the end"].append(over_post(live.url, args.rate, seed))
        report(rows, args)


if __name__ == "__main__":
    run_script(main)
