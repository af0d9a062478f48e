"""Turn and cancel latency of ``/v1/realtime`` at 1 and 8 concurrent sessions.

Run: ``python benchmarks/bench_realtime.py [--levels 1,8] [--turns 3] [--deploy FILE]``
(a few minutes on two CPU cores at the defaults; ``--smoke``: one session, one turn of
each kind, a short answer, every stage in one process, the voice appended four times
faster than real time (``--pace 4``), to check that the script still runs).

The deployment (default: ``examples/qwen3_omni_demo.toml``, the tiny random
Qwen3-Omni with every stage its own process, on the CPU) is served
in-process by ``omni_core.harness`` (the API server on its own event loop in
a thread of this process, the stages in their own processes). Clients are
the official ``openai`` SDK's realtime connection; the user's voice is
espeak-ng speech resampled to 24 kHz PCM16. Every clock is this client's
receive time of a server event (events are read as raw JSON, not through
the SDK's models, so that the client's parsing costs little). At each level
``N``, ``N`` sessions run at once, started together (a burst: the worst case
for admission), and each does ``--turns`` of each of:

* **turn**: server VAD on (``silence_duration_ms`` 500); the user talks in
  real time: 0.3 s of silence, one spoken sentence, then silence, in 100 ms
  appends one every 100 ms (the microphone keeps streaming silence while
  the answer plays). Measured from ``input_audio_buffer.speech_stopped`` to
  ``response.created`` (commit + admission), to the first
  ``response.output_audio_transcript.delta`` (thinker prefill + first token)
  and to the first ``response.output_audio.delta`` (+ talker + code2wav).
  The answer is capped at ``--answer-tokens``.
* **cancel**: turn detection off; the sentence is appended and committed,
  ``response.create`` asks for a long answer (``max_output_tokens`` 256, the
  demo's cap); at its first audio delta the client sends ``response.cancel``.
  Measured from the cancel sent to ``response.done`` (status ``cancelled``),
  and to the last audio delta received after the cancel (0 if none).
* **barge-in**: server VAD on (``create_response`` off); after a spoken
  turn, ``response.create`` asks for a long answer; at its first audio
  delta the user starts speaking over it (real time, as above). Measured
  from ``input_audio_buffer.speech_started`` to ``response.done``
  (cancelled, reason ``turn_detected``), and from the first append of that
  speech to ``speech_started`` (the VAD's delay: espeak's first 100 ms are
  already voiced, so mostly the append's trip) and to ``response.done``.

An answer that ends by itself before the cancel reaches it is counted by
status and left out of the cancel figures (the server then answers the late
``response.cancel`` with ``response_cancel_not_active``, counted too).

Each session is one conversation: its prompt grows turn by turn. The model
is random, so what it says is noise; every stage, stream and process runs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_core.sigterm import run_script

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent / "examples" / "qwen3_omni_demo.toml"
RATE = 24000
CHUNK_S = 0.1  # one append: 100 ms of audio, sent every 100 ms
LONG = 256  # the demo's cap (preprocessing's factory.max_tokens)
SENTENCE = "Hello there. Could you please tell me a short story about a cat?"
LATE = "response_cancel_not_active"  # a response.cancel that came after the answer ended
STARTED = "input_audio_buffer.speech_started"
TIMEOUT = 60.0  # seconds one step may take before the run fails


def speech(text: str, tmp: Path) -> bytes:
    """``text`` spoken by espeak-ng, as 24 kHz PCM16 little-endian."""
    import soundfile as sf

    from omni_core.serve.realtime.formats import resample

    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is not installed (apt-get install espeak-ng)")
    path = tmp / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    samples, rate = sf.read(path, dtype="int16")
    return resample(samples, rate, RATE).astype("<i2").tobytes()


def silence(seconds: float) -> bytes:
    return bytes(int(seconds * RATE) * 2)


def chunks(pcm: bytes) -> list[bytes]:
    step = int(CHUNK_S * RATE) * 2
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


@dataclass
class Tally:
    """Every figure of one level, in seconds (printed in milliseconds)."""

    created: list[float] = field(default_factory=list)
    first_text: list[float] = field(default_factory=list)
    first_audio: list[float] = field(default_factory=list)
    cancel_done: list[float] = field(default_factory=list)
    cancel_last_audio: list[float] = field(default_factory=list)
    barge_done: list[float] = field(default_factory=list)
    barge_vad: list[float] = field(default_factory=list)
    barge_heard: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    notes: Counter = field(default_factory=Counter)


class Session:
    """One realtime connection: typed sends through the SDK, events read as raw JSON."""

    def __init__(self, conn: Any, pace: float = 1.0):
        self.conn = conn
        self.pace = pace  # audio seconds appended per second (1: a microphone)
        self.events: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._read())
        self.late_cancels = 0

    async def _read(self) -> None:
        while True:
            raw = await self.conn.recv_bytes()
            self.events.put_nowait((time.perf_counter(), json.loads(raw)))

    async def until(self, *kinds: str) -> tuple[float, dict[str, Any], list]:
        """Events up to the first of ``kinds``: (its time, it, every event before it)."""
        seen: list[tuple[float, dict[str, Any]]] = []
        async with asyncio.timeout(TIMEOUT):
            while True:
                at, payload = await self.events.get()
                if payload["type"] == "error" and payload["error"].get("code") == LATE:
                    self.late_cancels += 1  # the answer had ended before the cancel came
                    continue
                if payload["type"] == "error":
                    raise RuntimeError(f"error event: {payload['error']}")
                if payload["type"] in kinds:
                    return at, payload, seen
                seen.append((at, payload))

    async def append(self, pcm: bytes) -> None:
        await self.conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())

    async def talk(self, pieces: list[bytes], then_silence: bool) -> float:
        """Append ``pieces`` at ``pace`` times real time (then silence, until cancelled); the
        start time."""
        start = time.perf_counter()
        quiet = silence(CHUNK_S)
        index = 0
        while index < len(pieces) or then_silence:
            due = start + index * CHUNK_S / self.pace
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            await self.append(pieces[index] if index < len(pieces) else quiet)
            index += 1
        return start

    async def close(self) -> None:
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


def describe(done: dict[str, Any]) -> str:
    """A ``response.done``'s status, with its reason when it has one."""
    response = done["response"]
    reason = (response.get("status_details") or {}).get("reason")
    return f"{response['status']} ({reason})" if reason else response["status"]


def vad_session(create_response: bool, max_tokens: int) -> dict[str, Any]:
    detection = {"type": "server_vad", "silence_duration_ms": 500}
    if not create_response:
        detection["create_response"] = False
    return {
        "type": "realtime",
        "max_output_tokens": max_tokens,
        "audio": {"input": {"turn_detection": detection}},
    }


async def connect(
    client: Any, config: dict[str, Any], body: Any, notes: Counter, pace: float
) -> None:
    async with client.realtime.connect(model="tiny") as conn:
        session = Session(conn, pace)
        try:
            await session.until("session.created")
            await conn.session.update(session=config)
            await session.until("session.updated")
            await body(session)
            if session.late_cancels:
                notes[LATE] += session.late_cancels
        finally:
            await session.close()


async def turns(client: Any, voice: bytes, args: argparse.Namespace, tally: Tally) -> None:
    async def body(session: Session) -> None:
        pieces = chunks(silence(0.3) + voice)
        for _ in range(args.turns):
            mic = asyncio.ensure_future(session.talk(pieces, then_silence=True))
            try:
                stopped, _, _ = await session.until("input_audio_buffer.speech_stopped")
                created, _, _ = await session.until("response.created")
                _, done, seen = await session.until("response.done")
            finally:
                mic.cancel()
                await asyncio.gather(mic, return_exceptions=True)
            tally.statuses[describe(done)] += 1
            text = [at for at, e in seen if e["type"] == "response.output_audio_transcript.delta"]
            audio = [at for at, e in seen if e["type"] == "response.output_audio.delta"]
            tally.created.append(created - stopped)
            if text:
                tally.first_text.append(text[0] - stopped)
            if audio:
                tally.first_audio.append(audio[0] - stopped)
            else:
                tally.notes["turn answered without audio"] += 1

    await connect(client, vad_session(True, args.answer_tokens), body, tally.notes, args.pace)


async def cancels(client: Any, voice: bytes, args: argparse.Namespace, tally: Tally) -> None:
    async def body(session: Session) -> None:
        conn = session.conn
        for _ in range(args.turns):
            for piece in chunks(voice):
                await session.append(piece)
            await conn.input_audio_buffer.commit()
            await session.until("input_audio_buffer.committed")
            await conn.response.create(response={"max_output_tokens": LONG})
            _, first, _ = await session.until("response.output_audio.delta", "response.done")
            if first["type"] == "response.done":
                tally.notes["long answer done before its first audio"] += 1
                continue
            sent = time.perf_counter()
            await conn.response.cancel()
            at, done, seen = await session.until("response.done")
            status = done["response"]["status"]
            tally.statuses[describe(done)] += 1
            if status != "cancelled":
                tally.notes[f"cancel: the answer ended {status}"] += 1
                continue
            audio = [t for t, e in seen if e["type"] == "response.output_audio.delta"]
            tally.cancel_done.append(at - sent)
            tally.cancel_last_audio.append(audio[-1] - sent if audio else 0.0)

    config = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    await connect(client, config, body, tally.notes, args.pace)


async def barge_ins(client: Any, voice: bytes, args: argparse.Namespace, tally: Tally) -> None:
    async def body(session: Session) -> None:
        conn = session.conn
        pieces = chunks(voice + silence(0.1))
        mic = asyncio.ensure_future(session.talk(chunks(silence(0.3)) + pieces, True))
        committed = False  # the turn that the next long answer answers is in
        try:
            for _ in range(args.turns):
                if not committed:
                    await session.until("input_audio_buffer.committed")
                committed = False
                await conn.response.create(response={"max_output_tokens": LONG})
                _, first, _ = await session.until("response.output_audio.delta", "response.done")
                if first["type"] == "response.done":
                    tally.notes["long answer done before its first audio"] += 1
                    continue
                mic.cancel()  # the user starts talking over the answer
                await asyncio.gather(mic, return_exceptions=True)
                mic = asyncio.ensure_future(session.talk(pieces, then_silence=True))
                speaking = time.perf_counter()
                # an answer that ends by itself first ends before speech_started
                first_at, first, seen = await session.until(STARTED, "response.done")
                other = "response.done" if first["type"] == STARTED else STARTED
                second_at, second, more = await session.until(other)
                seen += more
                if first["type"] == STARTED:
                    started, at, done = first_at, second_at, second
                else:
                    started, at, done = second_at, first_at, first
                    tally.notes["barge-in: response.done before speech_started"] += 1
                committed = any(e["type"] == "input_audio_buffer.committed" for _, e in seen)
                status = done["response"]["status"]
                tally.statuses[describe(done)] += 1
                if status != "cancelled":
                    audio = sum(e["type"] == "response.output_audio.delta" for _, e in seen)
                    usage = done["response"].get("usage") or {}
                    tally.notes[
                        f"barge-in: the answer ended {status} {(at - speaking) * 1e3:.0f} ms "
                        f"after its first audio delta ({audio} more audio deltas, "
                        f"{usage.get('output_tokens')} output tokens)"
                    ] += 1
                    continue
                tally.barge_vad.append(started - speaking)
                tally.barge_done.append(at - started)
                tally.barge_heard.append(at - speaking)
        finally:
            mic.cancel()
            await asyncio.gather(mic, return_exceptions=True)

    await connect(client, vad_session(False, LONG), body, tally.notes, args.pace)


async def level(url: str, sessions: int, voice: bytes, args: argparse.Namespace) -> Tally:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    tally = Tally()
    for phase in (turns, cancels, barge_ins):
        started = time.perf_counter()
        await asyncio.gather(*(phase(client, voice, args, tally) for _ in range(sessions)))
        print(f"  {sessions} x {phase.__name__}: {time.perf_counter() - started:.1f} s", flush=True)
    return tally


def quantile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def report(tallies: dict[int, Tally], args: argparse.Namespace, speech_s: float) -> None:
    rows = [
        ("turn: speech_stopped -> response.created", "created"),
        ("turn: speech_stopped -> first text delta", "first_text"),
        ("turn: speech_stopped -> first audio delta", "first_audio"),
        ("cancel: response.cancel -> response.done", "cancel_done"),
        ("cancel: response.cancel -> last audio delta", "cancel_last_audio"),
        ("barge-in: speech_started -> response.done", "barge_done"),
        ("barge-in: first speech append -> speech_started", "barge_vad"),
        ("barge-in: first speech append -> response.done", "barge_heard"),
    ]
    print(
        f"\n{os.cpu_count()} CPU cores; deploy {args.deploy}; speech {speech_s:.2f} s; "
        f"{args.turns} of each per session; turn answers <= {args.answer_tokens} tokens, "
        f"long answers <= {LONG}"
    )
    head = f"{'milliseconds: median / p90 (n)':<50}" + "".join(
        f"{f'{n} session' + ('s' if n > 1 else ''):>22}" for n in tallies
    )
    print(head)
    print("-" * len(head))
    for name, attr in rows:
        cells = ""
        for tally in tallies.values():
            values = getattr(tally, attr)
            low, high = quantile(values, 0.5) * 1e3, quantile(values, 0.9) * 1e3
            cell = f"{low:.1f} / {high:.1f} ({len(values)})"
            cells += f"{cell:>22}"
        print(f"{name:<50}{cells}")
    for sessions, tally in tallies.items():
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(tally.statuses.items()))
        notes = "; ".join(f"{k}: {v}" for k, v in tally.notes.items())
        print(
            f"{sessions} session{'s' if sessions > 1 else ''} x 3 phases: responses {statuses}"
            + (f"; {notes}" if notes else "")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,8", help="concurrent sessions, comma-separated")
    parser.add_argument("--turns", type=int, default=3, help="turns of each kind per session")
    parser.add_argument("--deploy", type=Path, default=DEMO, help="deploy file to serve")
    parser.add_argument("--answer-tokens", type=int, default=16, help="cap of a turn's answer")
    parser.add_argument(
        "--pace",
        type=float,
        default=None,
        help="audio seconds appended per second (default 1, a microphone; --smoke: 4, the "
        "same events, since the server's VAD counts audio, not the clock)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, one repeat: checks the script runs (make test)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.levels, args.turns, args.answer_tokens = "1", 1, 4
    if args.pace is None:
        args.pace = 4.0 if args.smoke else 1.0
    if args.pace <= 0:
        parser.error(f"--pace must be above 0, got {args.pace}")
    levels = [int(n) for n in args.levels.split(",") if n.strip()]

    from omni_core.harness import plan_on_cpu, short_private_dir
    from omni_core.plugins import OmniPlugins

    with tempfile.TemporaryDirectory(prefix="rt-bench-") as tmp, short_private_dir() as base:
        voice = speech(SENTENCE, Path(tmp))
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=args.deploy)
        if args.smoke:  # every stage in one process: the same code, started once
            flags = [
                f for stage in planned.config.stage_names for f in (f"--{stage}.process", "one")
            ]
            planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=args.deploy, flags=flags)
        started = time.perf_counter()
        with planned.serve() as live:
            print(f"served {args.deploy.name} in {time.perf_counter() - started:.1f} s", flush=True)
            if not args.smoke:  # one turn of each kind: --smoke's whole run
                warm = argparse.Namespace(**{**vars(args), "turns": 1})
                asyncio.run(level(live.url, 1, voice, warm))  # warm-up, not reported
            tallies = {n: asyncio.run(level(live.url, n, voice, args)) for n in levels}
        report(tallies, args, len(voice) / 2 / RATE)


if __name__ == "__main__":
    run_script(main)
