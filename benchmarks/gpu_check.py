"""GPU check: the CUDA tests, every demo on the GPU in bf16, and speed at release sizes.

Run on a machine with CUDA (``make gpu-check``; under 10 minutes on one H200)::

    .venv/bin/python benchmarks/gpu_check.py [--out gpu_check.json] [--levels 1,8,32]

Why: no GPU path of omni ran before this script; whenever a GPU is lent,
one command says whether the CUDA code works and how fast it is next to the
peers' published figures. Three phases, each with a time budget
(``--budget-scale`` stretches them); what a phase could not do in its time is
printed as skipped, never silently dropped:

1. **tests** (90 s): ``pytest -m cuda tests plugins``: every test marked
   ``cuda``, among them ``tests/cuda`` (each family's tiny model loaded on the
   GPU in bfloat16, a prefill and decode steps compared with the same model in
   float32 on the CPU; see the tests for the tolerances);
2. **demos** (120 s): every ``examples/*_demo.toml`` served by ``omni serve``
   on the GPU (``--placement.policy declared``, every GPU stage on GPU 0 with
   an equal share of 80 % of its memory, ``factory.dtype = "bfloat16"`` where
   the stage takes a dtype), answering one request of its API (speech: a wav;
   chat: a completion; transcription: the text of ``examples/media/hello.wav``),
   then stopped;
3. **throughput** (360 s): dummy weights at the release sizes -- Qwen3-TTS
   0.6B and 1.7B and MOSS-TTS 8B through their stages' own code
   (``bench_qwen3_tts.ours``, with the cache ``examples/qwen3_tts.toml``'s
   stage has on that GPU: ``TTS_MEMORY_SHARE`` of its memory, slots of up to
   32,768 positions; ``bench_moss_tts.ours``, with ``examples/moss_tts.toml``'s
   ``MOSS_MEMORY_SHARE``), Qwen3-Omni 30B-A3B
   speaking through the whole served graph (``bench_qwen3_omni_speech``), and
   last Qwen3-TTS 0.6B again with compiled decode steps
   (``engine.enable_torch_compile``: inductor's Triton kernels, each bucket
   and attention span then captured as a CUDA graph; levels up to 8, the buckets' ready time in
   the note; ``--smoke`` leaves it out unless ``--models`` names it) --
   at each concurrency of ``--levels``: audio seconds per wall second, time
   to first audio, and the real-time factor (a request's wall time over its
   audio seconds: requests of a level start together; each level above 1 is
   run once untimed first, so that choosing kernels for a new batch size is
   not charged to it). Each model runs in a
   child process of its own (its GPU memory freed when it exits), killed when
   the phase's time is up. The big models' dummy weights are drawn on the
   GPU (the plugins' seeded ``dummy`` loaders draw a model of 1 B parameters
   or more where it lives, a smaller one on the CPU; the CPU's generator
   fills about 350 M values a second here: 100 s for Qwen3-Omni's 35 B). The
   models run cheapest first, so that one that does not fit the phase leaves
   the others measured; what is left is reported as left out. Qwen3-TTS
   0.6B, eager and compiled, is also run once at c=8 under torch.profiler (``gpu_profile.py``):
   kernel launches, graph replays, host waits and copies per engine step,
   and the operators that took the most GPU time, printed above the table,
   with the vocoder's chunks timed eagerly and as CUDA graphs per shape
   (``bench_codec_graphs.py``; the Qwen3-TTS rows' vocoder captures its chunks
   as a served stage does, and the first row's note says how many graphs;
   the Qwen3-TTS and MOSS-TTS first rows' notes also set the CUDA memory their
   stages allocated at peak beyond the engine's share beside what the plan
   counts there, the engine's activations and graphs and the vocoder whole:
   ``omni_core/plan/headroom.py``, ``codec_footprint.py``);
   MOSS-TTS's first row also says what its vocoder captured
   (``omni_moss_tts/codec/graphs.py``);
   Qwen3-Omni's row comes with what each engine stage's log said of its static
   steps (which buckets were captured as CUDA graphs, how long that took, and
   why a step was not captured), and what its code2wav said of its chunks.
   ``--budget-scale 2`` gives every phase twice the time; ``--models`` names
   the models to measure and their order (a lease too short for all of them
   measures the one it is for first). A model killed
   at the phase's deadline leaves the end of what it printed (how far it got).
   With ``--out``, the tests' and each model's whole output is written beside it
   (``gpu_check.tests.log``, ``gpu_check.<model>.log``): a lease returns files, and
   a printed tail leaves off which tests failed and what an engine stage said.

The table is printed beside the peers' published figures and written as JSON
to ``--out``, rewritten after each phase and each measured model (``"finished":
false`` until the end), so that a run killed from outside keeps what it did.
Exit status: 0 when every phase that ran passed, 1 when one failed, 2 when
there is no CUDA device (nothing ran).

``--device cpu --smoke`` runs the same code on the CPU with tiny sizes (the
tests phase then skips every CUDA test, the demos phase serves one demo as
shipped, the throughput phase runs the tiny presets at concurrency 1 and 2),
so that ``make test`` checks this script too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omni_core.sigterm import Terminated, run_child, run_script

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PHASES = ("tests", "demos", "throughput")
BUDGETS_S = {"tests": 90.0, "demos": 120.0, "throughput": 360.0}  # 10 minutes minus slack
SMOKE_BUDGETS_S = {"tests": 300.0, "demos": 300.0, "throughput": 300.0}  # limits, not aims
# In this order, cheapest first: a model the phase's time cannot hold (Qwen3-Omni's seven
# processes and 35 B parameters) is killed last, after the others were measured.
# The compiled Qwen3-TTS row comes last: its start (inductor, then CUDA graphs of the
# compiled buckets) is the one cost no other row pays, and what it answers -- does fusing a
# frame's thousands of small kernels close the gap to vLLM-Omni's c=1 RTF -- matters less
# than the four release rows being there at all.
COMPILED = "qwen3-tts-0.6b-compiled"
RELEASE_MODELS = (
    "qwen3-tts-0.6b",
    "qwen3-tts-1.7b",
    "moss-tts-8b",
    "qwen3-omni-30b-a3b",
    COMPILED,
)
LABELS = {
    "qwen3-tts-0.6b": "Qwen3-TTS 0.6B",
    "qwen3-tts-1.7b": "Qwen3-TTS 1.7B",
    "moss-tts-8b": "MOSS-TTS 8B",
    "qwen3-omni-30b-a3b": "Qwen3-Omni 30B-A3B",
    COMPILED: "Qwen3-TTS 0.6B compiled",
}
#: The shares of GPU memory the Qwen3-TTS and MOSS-TTS rows size their caches from: those of
#: examples/qwen3_tts.toml's and examples/moss_tts.toml's stages.
TTS_MEMORY_SHARE = 0.6
MOSS_MEMORY_SHARE = 0.75
#: The compiled row's largest level (its largest bucket): each bucket is compiled and
#: captured before the clock starts, and 1..32 would take most of the phase's time.
COMPILED_MAX_LEVEL = 8
# The peers' published figures (their own reports; not measured here).
PEERS = [
    {
        "system": "vLLM-Omni",
        "model": "Qwen3-TTS 1.7B",
        "hardware": "1x H20",
        "concurrency": 1,
        "rtf": 0.15,
        "first_audio_ms": 165.0,
    },
    {
        "system": "SGLang-Omni",
        "model": "Qwen3-TTS 0.6B",
        "hardware": "1x H200",
        "concurrency": 16,
        "rtf": 1.51,
        "first_audio_ms": None,
    },
    {
        "system": "SGLang-Omni",
        "model": "Qwen3-Omni 30B-A3B",
        "hardware": "2x H200",
        "concurrency": 16,
        "rtf": 0.827,
        "first_audio_ms": None,
    },
]
TTS_FRAMES = 48  # 3.84 s of audio per request
PROFILE_AT = 8  # Qwen3-TTS 0.6B is profiled at this concurrency (gpu_profile.py)
OMNI_TOKENS, OMNI_FRAMES = 32, 48


@dataclass
class Row:
    """One measured level of one model."""

    model: str
    concurrency: int
    audio_s_per_s: float
    first_audio_ms: float
    rtf: float
    note: str = ""


@dataclass
class Report:
    device: str
    smoke: bool
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    out: Path | None = None  # --out: rewritten after each phase and each measured model
    finished: bool = False
    # model -> what its run said of itself: Qwen3-TTS's gpu_profile.summary, Qwen3-Omni's
    # engine stages' static steps (captured as CUDA graphs or not, and why)
    profiles: dict[str, str] = field(default_factory=dict)

    def skip(self, what: str) -> None:
        self.skipped.append(what)
        print(f"  skipped: {what}", flush=True)

    def keep_log(self, name: str, text: str) -> str:
        """Write a phase's or a model's whole output beside ``--out`` (``gpu_check.NAME.log``),
        so that what a printed tail leaves off (which tests failed, a child's engine lines)
        still comes back from the lease; returns where, or "" without ``--out``."""
        if self.out is None:
            return ""
        path = self.out.with_name(f"{self.out.stem}.{name}.log")
        path.write_text(text)
        return str(path)

    def save(self) -> None:
        """Write what is known so far: a run killed from outside (a lease's time limit)
        still leaves the phases and models it finished, marked ``"finished": false``."""
        if self.out is not None:
            write_json(self, self.out)


class Clock:
    """A phase's time budget."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


# -- phase 1: the CUDA tests ----------------------------------------------------------------


def phase_tests(report: Report, clock: Clock, smoke: bool) -> None:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "-m", "cuda"]
    argv += ["--tb=short"]
    # --smoke collects tests/cuda alone: the whole suite's collection takes longer than the rest
    argv += ["tests/cuda"] if smoke else ["tests", "plugins"]
    try:
        done = run_child(argv, cwd=REPO, timeout=max(clock.left(), 1.0), grace=10)
    except subprocess.TimeoutExpired as killed:
        report.keep_log("tests", said_before_kill(killed, keep=10**7))
        report.skip(f"tests: pytest -m cuda did not finish in the phase's time ({argv[-1]})")
        report.phases["tests"] = {"status": "out of time"}
        return
    kept = report.keep_log("tests", done.stdout + done.stderr)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
    ok = done.returncode == 0 and counts.get("failed", 0) == 0 and counts.get("error", 0) == 0
    print(f"  pytest -m cuda: {summary}" + (f" (whole output: {kept})" if kept else ""))
    if not ok:
        # every failure's one line (-rfE), then the tail of the last one's traceback
        print(
            "\n".join(
                line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))
            )
        )
        print(done.stdout[-4000:] + done.stderr[-2000:])
        report.failed.append("tests")
    report.phases["tests"] = {"status": "passed" if ok else "FAILED", "summary": summary, **counts}


# -- phase 2: every demo served on the device -------------------------------------------------


def demo_flags(demo: Path, device: str) -> tuple[list[str], tuple[str, ...]]:
    """Flags that put ``demo`` on the GPU in bf16 (none on the CPU), and its pipeline's APIs."""
    from omni_core.config import load_deployment
    from omni_core.plugins import OmniPlugins

    config = load_deployment(str(demo), [], plugins=OmniPlugins()).config
    flags: list[str] = []
    if device.startswith("cuda"):
        flags += ["--placement.policy", "declared"]
        on_gpu = [stage for stage in config.stages if stage.gpu is not None]
        share = f"{0.8 / max(len(on_gpu), 1):.3f}"  # declared: processes sharing a GPU need one
        for stage in on_gpu:
            flags += [f"--{stage.name}.gpu", "0", f"--{stage.name}.gpu_memory_fraction", share]
        for stage in config.stages:
            if "dtype" in type(stage.factory).model_fields:
                flags += [f"--{stage.name}.factory.dtype", "bfloat16"]
    return flags, tuple(type(config).api)


def post_json(url: str, body: dict[str, Any], timeout: float) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post_form(
    url: str, fields: dict[str, str], file: tuple[str, str, bytes], timeout: float
) -> tuple[int, bytes]:
    """A multipart/form-data POST (fields and one file), as the transcription API takes it."""
    boundary = "omni-gpu-check-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    name, filename, data = file
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"'
        f"\r\nContent-Type: audio/wav\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, body, headers), timeout=timeout
        ) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def ask_demo(url: str, api: tuple[str, ...], timeout: float) -> str:
    """One request of the demo's API; what came back, or raises saying what was wrong."""
    from soak import fetch_json

    models = fetch_json(url + "/v1/models") or {}
    model = (models.get("data") or [{}])[0].get("id", "")
    if "speech" in api:
        voices = fetch_json(url + "/v1/audio/voices") or {}
        names = [v["name"] for v in voices.get("data", [])]
        # greedy: sampled, a tiny random talker draws its end of speech at the first frame
        # now and then (an empty wav), which would fail a lease on a coin toss
        body = {
            "model": model,
            "input": "Hello from the GPU check.",
            "response_format": "wav",
            "temperature": 0,
        }
        if names:
            body["voice"] = names[0]
        status, data = post_json(url + "/v1/audio/speech", body, timeout)
        if status != 200 or data[:4] != b"RIFF" or len(data) <= 44:
            raise RuntimeError(f"speech answered {status}: {data[:300]!r}")
        return f"speech: {len(data) - 44} bytes of wav ({(len(data) - 44) / 48000:.2f} s)"
    if "chat" not in api and "transcription" in api:
        status, data = post_form(
            url + "/v1/audio/transcriptions",
            {"model": model},
            ("file", "hello.wav", (REPO / "examples" / "media" / "hello.wav").read_bytes()),
            timeout,
        )
        text = json.loads(data).get("text") if status == 200 else None
        if not isinstance(text, str):
            raise RuntimeError(f"transcription answered {status}: {data[:300]!r}")
        return f"transcription: {text[:40]!r}"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    status, data = post_json(url + "/v1/chat/completions", body, timeout)
    answer = json.loads(data) if status == 200 else {}
    text = (answer.get("choices") or [{}])[0].get("message", {}).get("content")
    if status != 200 or not isinstance(text, str):
        raise RuntimeError(f"chat answered {status}: {data[:300]!r}")
    return f"chat: {answer.get('usage', {}).get('completion_tokens')} tokens"


def phase_demos(report: Report, clock: Clock, device: str, smoke: bool) -> None:
    from soak import Server

    demos = sorted((REPO / "examples").glob("*_demo.toml"))
    if smoke:  # the one that starts fastest: the script's path, not every model, is checked
        first = [d for d in demos if d.name == "qwen3_tts_demo.toml"] or demos[:1]
        for demo in demos:
            if demo not in first:
                report.skip(f"demos: {demo.name} (--smoke serves one demo)")
        demos = first
    results: dict[str, str] = {}
    # named first and made inside the try: a SIGTERM between mkdtemp's mkdir and the try
    # would leave the directory behind
    workdir = Path(tempfile.gettempdir()) / f"gpu-check-{secrets.token_hex(6)}"
    try:
        workdir.mkdir(mode=0o700)
        for demo in demos:
            if clock.left() < 20:
                report.skip(f"demos: {demo.name} (no time left in the phase)")
                continue
            flags, api = demo_flags(demo, device)
            server = Server(demo.stem, demo, flags, workdir)
            started = time.monotonic()
            try:
                server.start()
                server.wait_ready(max(clock.left() - 10, 5))
                up = time.monotonic() - started
                said = ask_demo(server.url, api, max(clock.left(), 5))
                results[demo.name] = f"ok: up in {up:.1f} s; {said}"
            except RuntimeError as exc:
                results[demo.name] = f"FAILED: {exc}"[:2000]
                report.failed.append(f"demos: {demo.name}")
            finally:
                server.stop()
            print(f"  {demo.name}: {results[demo.name]}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report.phases["demos"] = {"flags": "bf16 on GPU 0" if device != "cpu" else "as shipped"}
    report.phases["demos"].update(results)


# -- phase 3: throughput, first audio and RTF at release sizes --------------------------------


def level_row(model: str, c: int, wall_s: float, audio_s: float, first_s: list[float]) -> Row:
    """Figures of one level whose ``c`` requests started together."""
    return Row(
        model=model,
        concurrency=c,
        audio_s_per_s=audio_s / wall_s,
        first_audio_ms=1e3 * statistics.mean(first_s),
        rtf=wall_s / (audio_s / c),
    )


class EchoKept(io.TextIOBase):
    """stdout that still prints and also keeps what passed, for lines a model's run
    prints of itself (the engine's "ready in" line comes from its compute thread)."""

    def __init__(self, echo: Any):
        self.echo, self.parts = echo, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.echo.write(text)

    def flush(self) -> None:
        self.echo.flush()

    def lines(self) -> list[str]:
        return "".join(self.parts).splitlines()


def measure_qwen3_tts(
    size: str,
    device: str,
    levels: list[int],
    frames: int,
    profile: bool = False,
    compiled: bool = False,
) -> tuple[list[Row], str | None]:
    """The levels, then (``profile``) one profiled pass at ``PROFILE_AT`` (smoke: 2).

    ``compiled``: with ``engine.enable_torch_compile`` (inductor; on CUDA each
    compiled bucket captured as a CUDA graph too), levels up to
    ``COMPILED_MAX_LEVEL``, the profiled pass too (its graphs built again, from
    inductor's cache); the rows' note says how long the buckets took to get
    ready, from the engine's own line.
    """
    import anyio
    import bench_qwen3_tts as bench

    from omni_qwen3_tts.model import Qwen3TTSModel

    dtype = "float32" if device == "cpu" else "bfloat16"
    if compiled:
        levels = [c for c in levels if c <= COMPILED_MAX_LEVEL] or [1]
    with tempfile.TemporaryDirectory(prefix="gpu-check-tts-") as tmp:
        bench.write_configs(Path(tmp), frames, size)
        model = Qwen3TTSModel.from_pretrained(
            tmp, load_format="dummy", seed=0, dtype=dtype, device=device
        )
        planned = planned_beyond_share("omni_qwen3_tts", "Qwen3TTSPipeline", tmp)
    # On a GPU the cache is sized as examples/qwen3_tts.toml's stage sizes it (a share of
    # memory: slots of up to 32,768 positions), so the rows measure the attention spans a
    # served stage reads; the CPU keeps 512 positions a request.
    share = None if device == "cpu" else TTS_MEMORY_SHARE
    on_cpu = device == "cpu"
    reset_peak(device)
    runs, printed = run_echoed(
        bench.ours, model, frames, levels, None, None, on_cpu, compiled, memory_share=share
    )
    memory = beyond_share(device, share, planned)
    ready = [line for line in printed if line.startswith("engine: ") and "ready in" in line]
    cache = cache_note(printed, bench.CACHE_MARK)
    codec = codec_note(printed)
    label = f"Qwen3-TTS {size}" + (" compiled" if compiled else "")
    rows = []
    for r in runs:
        row = level_row(label, r.concurrency, r.wall_s, r.audio_s, r.first_chunk_s)
        notes = []
        if r.decode_s:  # c=1: the engine's frame (its codes end on the host: synchronised)
            per_frame = r.wall_s / (r.audio_s * bench.SAMPLE_RATE / bench.SAMPLES_PER_FRAME)
            # the codec's calls end with the audio on the host: their wall time holds their
            # kernels, so the note says whether the codec is worth capturing too
            notes.append(
                f"engine {1e3 * r.decode_s:.1f}, codec {1e3 * r.codec_s:.1f} "
                f"of {1e3 * per_frame:.1f} ms a frame"
            )
        if compiled:
            notes.append(ready_note(ready))
        if share is not None and cache and r.concurrency == runs[0].concurrency:
            notes.append(cache)  # sized from memory: what spans the steps may read
        if codec and r.concurrency == runs[0].concurrency:
            notes.append(codec)  # its chunks as CUDA graphs, or why not
        if memory and r.concurrency == runs[0].concurrency:
            notes.append(memory)  # the planner's allowances against the GPU's own count
        row.note = "; ".join(notes)
        rows.append(row)
    where = None
    if profile:
        width = min(PROFILE_AT, max(levels))
        where = f"where the time goes (torch.profiler, gpu_profile.py) at c={width}, "
        where += f"{min(frames, 16)} frames a request:\n"
        try:  # the rows above are the figures: a profiler that breaks must not lose them
            where += anyio.run(bench.profiled_level, model, min(frames, 16), width, compiled)
        except Exception as exc:
            where += f"the profiled pass failed: {type(exc).__name__}: {exc}"
        if not compiled:  # the codec's chunks, eager against captured (bench_codec_graphs.py)
            where += "\n" + codec_graphs(model, on_cpu)
    return rows, where


def codec_graphs(model: Any, on_cpu: bool) -> str:
    """The vocoder's chunks eagerly and as CUDA graphs, per shape: whether capturing the
    codec pays (the CPU's smoke run replays through the graphs' stand-in)."""
    import bench_codec_graphs as codec

    shapes = codec.SMOKE_SHAPES if on_cpu else codec.SHAPES
    try:  # as the profile: a failure here must not lose the rows
        return codec.compare(model.speech_tokenizer.decoder, shapes, 1 if on_cpu else 10, on_cpu)
    except Exception as exc:
        return f"codec chunks, eager against captured: failed: {type(exc).__name__}: {exc}"


def run_echoed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """``anyio.run(fn, *args, **kwargs)``, its stdout printed as it comes and kept: what it
    returned and the lines it printed (the engine's lines, which the notes quote)."""
    import anyio

    kept = EchoKept(sys.stdout)
    with contextlib.redirect_stdout(kept):
        result = anyio.run(functools.partial(fn, *args, **kwargs))
    return result, kept.lines()


def cache_note(lines: list[str], mark: str) -> str:
    """The engine's cache as ``bench_qwen3_tts.ours`` printed it ("cache: 8 slots of 32768
    positions (memory, ...)"), or "" when it printed none."""
    found = next((line for line in lines if line.startswith(mark)), None)
    return "" if found is None else "cache: " + found[len(mark) :].strip()


def codec_note(lines: list[str]) -> str:
    """What the vocoder said of its chunks ("vocoder: streamed chunks captured as 15 CUDA
    graphs (...) in 1.2 s, ...") as "codec: 15 CUDA graphs in 1.2 s", its reason where it
    captured none, or "" where it said nothing (the CPU)."""
    found = next((line for line in lines if line.startswith("vocoder: ")), None)
    if found is None:
        return ""
    said = found[len("vocoder: ") :].strip()
    captured = re.match(r"streamed chunks captured as (\d+) CUDA graphs .* in ([\d.]+) s", said)
    if captured:
        return f"codec: {captured.group(1)} CUDA graphs in {captured.group(2)} s"
    return f"codec: {said}"


def ready_note(ready: list[str]) -> str:
    """What the engine said of its compiled steps, as "<how>, ready in N s" (the first line),
    with how many graphs inductor built where the engine says (one a bucket would show a
    step that guards on its batch)."""
    if not ready:
        return "no compiled steps: the engine printed no ready line"
    found = re.search(
        r"engine: (.*?)(?: \(engine\.[^)]*\))?: .* ready in ([\d.]+) s(?: \((\d+) compiled graph)?",
        ready[0],
    )
    if not found:
        return ready[0]
    count = found.group(3)
    graphs = f", {count} compiled graph{'s' * (count != '1')}" if count else ""
    return f"{found.group(1)}, ready in {found.group(2)} s{graphs}"


def measure_moss(device: str, levels: list[int], frames: int, smoke: bool) -> list[Row]:
    import bench_moss_tts as bench

    gpu_id = None if device == "cpu" else torch_index(device)
    dtype = "float32" if device == "cpu" else "bfloat16"
    note = ""
    with tempfile.TemporaryDirectory(prefix="gpu-check-moss-") as tmp:
        model: str | Path = "tiny"
        if not smoke:
            root = Path(tmp)
            try:
                bench.write_configs(root, 36, bench.DEFAULT_REF_SRC)
            except FileNotFoundError:
                # The codec's released config.json is not in this repository: the tiny
                # preset's codec stands in (the backbone, which dominates, is at 8B).
                write_moss_configs_with_tiny_codec(bench, root)
                note = (
                    "codec: tiny preset's (its release config.json not found: set "
                    "MOSS_TTS_REF_SRC to a folder holding MOSS-Audio-Tokenizer/config.json)"
                )
            model = root / "model"
        # as examples/moss_tts.toml's stage sizes its cache there
        share = None if gpu_id is None else MOSS_MEMORY_SHARE
        planned = planned_beyond_share("omni_moss_tts", "MossTTSPipeline", str(model))
        reset_peak(device)
        (runs, _, _), printed = run_echoed(
            bench.ours, model, frames, levels, 0, None, "dummy", gpu_id, dtype, memory_share=share
        )
        memory = beyond_share(device, share, planned)
    label = "MOSS-TTS tiny" if smoke else "MOSS-TTS 8B"
    rows = [level_row(label, r.concurrency, r.wall_s, r.audio_s, r.first_audio_s) for r in runs]
    cache = cache_note(printed, bench.CACHE_MARK) if share is not None else ""
    codec = codec_note(printed)  # its chunks as CUDA graphs (codec/graphs.py), or why not
    for i, (row, run) in enumerate(zip(rows, runs, strict=True)):
        split = moss_frame_split(bench, run) if run.codec_s else ""
        first = (codec, cache, memory) if i == 0 else ()
        row.note = "; ".join(part for part in (split, note, *first) if part)
    return rows


def planned_beyond_share(package: str, pipeline: str, model_path: str) -> int | None:
    """What the plan counts outside an engine's share for the model at ``model_path``
    with its stages' defaults: the engine's activations and graphs, the vocoder whole
    (``omni_core/plan/headroom.py``); None where the plugin cannot say."""
    import importlib

    try:
        memory = importlib.import_module(f"{package}.memory")
        config = getattr(importlib.import_module(f"{package}.pipeline"), pipeline)
        estimates = memory.estimate(config(model_path=str(model_path)))
        return estimates["tts_engine"].overhead_bytes + estimates["vocoder"].total_bytes
    except Exception:  # a figure to print, never a reason to lose the rows
        return None


def reset_peak(device: str) -> None:
    """Start counting this model's peak of CUDA memory (nothing on the CPU)."""
    if device != "cpu":
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def beyond_share(device: str, share: float | None, planned: int | None) -> str:
    """``beyond_share_note`` of this model's run on ``device`` ("" on the CPU)."""
    if device == "cpu" or share is None:
        return ""
    import torch

    peak = torch.cuda.max_memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory
    return beyond_share_note(peak, total, share, planned)


def beyond_share_note(peak: int, total: int, share: float, planned: int | None) -> str:
    """The peak of CUDA memory the model's stages allocated beyond its engine's share,
    beside what the plan counts there: whether the planner's allowances hold."""
    beyond = peak - share * total
    said = f"memory beyond the engine's {share:g} share: {beyond / 2**30:.2f} GiB at peak"
    if planned is None:
        return said
    return f"{said} (the plan counts {planned / 2**30:.2f})"


def moss_frame_split(bench: Any, run: Any) -> str:
    """``engine E, codec C of F ms a frame`` for a MOSS-TTS level at concurrency 1.

    Each share is per audio frame: the engine's, its backbone calls and its
    heads and sampling (the sampled tokens end on the host, so the pair holds
    the steps' kernels), prefill and the delay pattern's extra steps included;
    the codec's, its calls' wall time (``codec_watch.py``). In MOSS-TTS the two
    run in threads side by side, so they may add up to more than the frame.
    """
    frames = run.audio_s * bench.FRAME_RATE
    frame_ms, engine_ms = 1e3 * run.wall_s / frames, 1e3 * run.parts["engine_s"] / frames
    return f"engine {engine_ms:.1f}, codec {1e3 * run.codec_s:.1f} of {frame_ms:.1f} ms a frame"


def write_moss_configs_with_tiny_codec(bench: Any, root: Path) -> None:
    tiny_codec = bench.PRESETS_DIR / "tiny" / "codec"
    src = root / "src"
    (src / "MOSS-Audio-Tokenizer").mkdir(parents=True)
    shutil.copy(tiny_codec / "config.json", src / "MOSS-Audio-Tokenizer" / "config.json")
    bench.write_configs(root, 36, src)


def torch_index(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0


def measure_qwen3_omni(device: str, levels: list[int], smoke: bool) -> tuple[list[Row], str | None]:
    """Qwen3-Omni answering in speech through its whole graph, planned onto one device;
    with what its engine stages said of their static steps (CUDA graphs captured or not)."""
    import anyio
    import bench_qwen3_omni_speech as bench

    from omni_core.harness import short_private_dir

    args = argparse.Namespace(
        levels=levels,
        tokens=4 if smoke else OMNI_TOKENS,
        frames=4 if smoke else OMNI_FRAMES,
        greedy=False,
        seed=0,
        warm_each_level=True,  # as the TTS benchmarks do on a GPU: a width's first pass untimed
    )
    requests = bench.make_requests(max(levels), 0)
    flags = ["--talker_ar.factory.max_frames", str(args.frames)]
    stages = ("preprocessing", "decode", *bench.LOADED)
    with tempfile.TemporaryDirectory(prefix="gpu-check-omni-") as tmp, short_private_dir() as base:
        if smoke:  # the demo, every stage in one process (as bench_qwen3_omni_speech --smoke)
            deploy: Path | None = REPO / "examples" / "qwen3_omni_demo.toml"
            policy: str | None = "cpu"
            flags += [f for stage in stages for f in (f"--{stage}.process", "smoke")]
        else:
            deploy, policy = None, None
            ckpt = release_omni_checkpoint(bench, Path(tmp))
            # auto: the plugins' memory estimates at these sizes in bf16 size each stage's share
            flags += ["--model-path", str(ckpt), "--placement.policy", "auto"]
            flags += ["--cluster.gpus", "1", "--cluster.gpu_memory", str(gpu_memory(device))]
            for stage in bench.LOADED:
                flags += [f"--{stage}.factory.load_format", "dummy"]
                flags += [f"--{stage}.factory.dtype", "bfloat16", f"--{stage}.gpu", "0"]
        ours = anyio.run(bench.measure_ours, base, args, requests, flags, deploy, policy)
    label = "Qwen3-Omni tiny" if smoke else "Qwen3-Omni 30B-A3B"
    rows = []
    for level in ours["levels"]:
        answers = level.answers
        rows.append(
            Row(
                model=label,
                concurrency=level.concurrency,
                audio_s_per_s=level.throughput(),
                first_audio_ms=1e3 * statistics.mean(a.ttfa_s for a in answers),
                rtf=statistics.mean(a.wall_s / a.audio_s for a in answers),
            )
        )
    return rows, bench.engine_report(ours)


def release_omni_checkpoint(bench: Any, root: Path) -> Path:
    """Configs at the release's sizes (48 / 27 / 20 / 8 layers) beside the tiny tokenizer."""
    from omni_qwen3_omni.source import PRESETS_DIR

    ckpt = root / "ckpt"
    shutil.copytree(PRESETS_DIR / "tiny", ckpt)
    sizes = argparse.Namespace(layers=48, vision_depth=27, talker_layers=20, code2wav_layers=8)
    (ckpt / "config.json").write_text(json.dumps(bench.root_config(sizes), indent=1))
    return ckpt


def gpu_memory(device: str) -> int:
    import torch

    return int(torch.cuda.get_device_properties(torch_index(device)).total_memory)


def measure(name: str, device: str, levels: list[int], smoke: bool) -> tuple[list[Row], str | None]:
    """One model's rows, and a profile where one is taken (in a child: ``--measure NAME``)."""
    sys.path.insert(0, str(HERE))
    frames = 4 if smoke else TTS_FRAMES
    if name == COMPILED:  # profiled too: its kernels per step beside the eager row's
        size = "tiny" if smoke else "0.6B"
        return measure_qwen3_tts(size, device, levels, frames, profile=True, compiled=True)
    if name.startswith("qwen3-tts-"):
        size = "tiny" if smoke else name.rsplit("-", 1)[1].upper()
        return measure_qwen3_tts(size, device, levels, frames, profile=name == RELEASE_MODELS[0])
    if name == "moss-tts-8b":
        return measure_moss(device, levels, frames, smoke), None
    if name == "qwen3-omni-30b-a3b":
        return measure_qwen3_omni(device, levels, smoke)
    raise SystemExit(f"gpu_check: no model {name!r}; known: {', '.join(RELEASE_MODELS)}")


def phase_throughput(
    report: Report,
    clock: Clock,
    device: str,
    levels: list[int],
    smoke: bool,
    models: tuple[str, ...] = RELEASE_MODELS,
) -> None:
    for name in RELEASE_MODELS:
        if name not in models:
            report.skip(f"throughput: {LABELS[name]} (not asked for: --models)")
    if smoke and models == RELEASE_MODELS:
        # inductor on these 2 cores takes half a minute even at tiny sizes: checked where asked
        models = tuple(m for m in models if m != COMPILED)
        report.skip(
            f"throughput: {LABELS[COMPILED]} (--smoke: compiling takes half a minute on the CPU; "
            f"--models {COMPILED} checks it)"
        )
    if smoke and "qwen3-tts-1.7b" in models:  # each family once, tiny
        models = tuple(m for m in models if m != "qwen3-tts-1.7b")
        report.skip("throughput: Qwen3-TTS 1.7B (--smoke: each family once, tiny)")
    for name in models:
        if clock.left() < 15:
            report.skip(f"throughput: {LABELS[name]} (no time left in the phase)")
            continue
        with tempfile.NamedTemporaryFile(prefix="gpu-check-", suffix=".json") as out:
            argv = [sys.executable, __file__, "--measure", name, "--device", device]
            argv += ["--levels", ",".join(map(str, levels)), "--out", out.name]
            argv += ["--smoke"] if smoke else []
            started = time.monotonic()
            try:
                done = run_child(argv, cwd=REPO, timeout=clock.left(), grace=10)
            except subprocess.TimeoutExpired as killed:
                # what it printed before the kill says how far it got (loading, capture, a level)
                print(said_before_kill(killed))
                report.keep_log(name, said_before_kill(killed, keep=10**7))
                report.skip(f"throughput: {LABELS[name]} (killed: the phase's time ran out)")
                continue
            report.keep_log(name, done.stdout + done.stderr)
            if done.returncode != 0:
                print(done.stdout[-2000:] + done.stderr[-4000:])
                report.failed.append(f"throughput: {LABELS[name]}")
                continue
            measured = json.loads(Path(out.name).read_text())
            rows = [Row(**row) for row in measured["rows"]]
        report.rows += rows
        if measured["profile"]:
            report.profiles[rows[0].model] = measured["profile"]
        report.save()
        print(f"  {LABELS[name]}: {len(rows)} levels in {time.monotonic() - started:.0f} s")


def said_before_kill(killed: subprocess.TimeoutExpired, keep: int = 3000) -> str:
    """The end of what a child killed at the phase's deadline wrote, indented."""
    said = ""
    for stream in (killed.stdout, killed.stderr):
        if stream:
            said += stream.decode(errors="replace") if isinstance(stream, bytes) else stream
    tail = said[-keep:].strip() or "(nothing)"
    return "  killed; its last output:\n" + "\n".join("    " + line for line in tail.splitlines())


# -- the table ------------------------------------------------------------------------------


def print_table(report: Report) -> None:
    for model, text in report.profiles.items():
        print(f"\n{model}, {text}")
    print(f"\nthroughput, first audio and RTF on {report.device} (dummy weights):")
    head = f"{'model':<20} {'c':>3} {'audio s/s':>10} {'first audio ms':>15} {'RTF':>7}  note"
    print(head)
    print("-" * len(head))
    for row in report.rows:
        print(
            f"{row.model:<20} {row.concurrency:>3} {row.audio_s_per_s:>10.3f} "
            f"{row.first_audio_ms:>15.1f} {row.rtf:>7.3f}  {row.note}"
        )
    print("\nthe peers' published figures, beside ours at the nearest concurrencies:")
    for peer in PEERS:
        first = peer["first_audio_ms"]
        said = f"RTF {peer['rtf']}" + (f", first audio {first:g} ms" if first else "")
        ours = [r for r in report.rows if r.model == peer["model"]]
        if ours:
            nearest = sorted(ours, key=lambda r: abs(math.log(r.concurrency / peer["concurrency"])))
            mine = "; ".join(
                f"c={r.concurrency}: RTF {r.rtf:.3f}, first audio {r.first_audio_ms:.0f} ms"
                for r in nearest[:2]
            )
        else:
            mine = "not measured in this run"
        print(
            f"  {peer['system']} {peer['model']} on {peer['hardware']}, c={peer['concurrency']}: "
            f"{said} | ours: {mine}"
        )


def write_json(report: Report, path: Path) -> None:
    doc = {
        "device": report.device,
        "smoke": report.smoke,
        "phases": report.phases,
        "table": [asdict(row) for row in report.rows],
        "peers": PEERS,
        "skipped": report.skipped,
        "failed": report.failed,
        "finished": report.finished,
        "profiles": report.profiles,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)  # never a half-written file


# -- main -----------------------------------------------------------------------------------


def device_problem(device: str, smoke: bool) -> str | None:
    """Why the check cannot run on ``device`` (None: it can)."""
    if device == "cpu":
        return None if smoke else "--device cpu runs only with --smoke (a check of this script)"
    if not re.fullmatch(r"cuda(:\d+)?", device):
        return f"--device {device!r}: use cuda, cuda:N, or cpu with --smoke"
    import torch

    if not torch.cuda.is_available():
        return (
            f"no CUDA device here (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda or 'none'}): run it where a GPU is, or use --device cpu "
            "--smoke to check the script itself"
        )
    if torch_index(device) >= torch.cuda.device_count():
        return f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)"
    return None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu with --smoke")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, concurrency 1 and 2, one demo: checks the script runs (make test)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    parser.add_argument("--levels", default=None, help="concurrency levels (default 1,8,32)")
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"which phases, of {', '.join(PHASES)}"
    )
    parser.add_argument(
        "--budget-scale", type=float, default=1.0, help="multiply every phase's time budget"
    )
    parser.add_argument(
        "--models",
        default=",".join(RELEASE_MODELS),
        help="the throughput phase's models, measured in this order (default: cheapest "
        f"first, the compiled row last: {','.join(RELEASE_MODELS)})",
    )
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args()
    args.levels = [int(c) for c in (args.levels or ("1,2" if args.smoke else "1,8,32")).split(",")]
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(args.phases) - set(PHASES))
    if unknown:
        parser.error(f"--phases: unknown {unknown}; choose from {', '.join(PHASES)}")
    args.models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    unknown = sorted(set(args.models) - set(RELEASE_MODELS))
    if unknown or not args.models:
        said = f"unknown {', '.join(unknown)}" if unknown else "none named"
        parser.error(f"--models: {said}; choose from {', '.join(RELEASE_MODELS)}")
    return args


def main() -> int:
    args = parse_args()
    problem = device_problem(args.device, args.smoke)
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return 2
    if args.measure:  # a child of the throughput phase
        rows, profile = measure(args.measure, args.device, args.levels, args.smoke)
        for row in rows:  # into the model's log beside --out, with what it said of itself
            print(json.dumps(asdict(row)))
        print(profile or "", flush=True)
        doc = {"rows": [asdict(row) for row in rows], "profile": profile}
        args.out.write_text(json.dumps(doc))
        return 0
    sys.path.insert(0, str(HERE))
    os.environ.setdefault("OMP_NUM_THREADS", "2" if args.smoke else "8")
    budgets = SMOKE_BUDGETS_S if args.smoke else BUDGETS_S
    report = Report(args.device, args.smoke, out=args.out)
    began = time.monotonic()
    for phase in PHASES:
        if phase not in args.phases:
            report.skip(f"{phase}: not asked for (--phases)")
            continue
        budget = budgets[phase] * args.budget_scale
        print(f"phase {phase} (budget {budget:.0f} s)", flush=True)
        clock = Clock(budget)
        try:
            if phase == "tests":
                phase_tests(report, clock, args.smoke)
            elif phase == "demos":
                phase_demos(report, clock, args.device, args.smoke)
            else:
                phase_throughput(report, clock, args.device, args.levels, args.smoke, args.models)
        except Terminated:
            # a lease's time limit (timeout sends SIGTERM first): the phase's servers and
            # children are stopped by now; what was measured still reaches the output
            print(f"\ngpu_check stopped by SIGTERM during phase {phase}", flush=True)
            print_table(report)
            raise
        report.save()
    print_table(report)
    if report.skipped:
        print("\nleft out (lack of time, or by choice):\n  " + "\n  ".join(report.skipped))
    verdict = "FAILED: " + ", ".join(report.failed) if report.failed else "passed"
    print(f"\ngpu_check {verdict} in {time.monotonic() - began:.0f} s on {args.device}")
    report.finished = True
    if args.out is not None:
        report.save()
        print(f"table written to {args.out}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    run_script(main)
