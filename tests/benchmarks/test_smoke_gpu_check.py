"""``benchmarks/gpu_check.py`` checked on the CPU: ``--device cpu --smoke`` and its refusals.

On a GPU machine the script runs the CUDA tests, the demos and the
release-size measurements (``make gpu-check``); here the same code runs
with tiny sizes, so that the script cannot rot before a GPU is lent.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

GROUP = "gpu_check"


def test_gpu_check_smoke_runs_every_phase_on_the_cpu(run_smoke, short_tmp):
    """Its tests phase runs pytest by design, so this run keeps pytest importable;
    the measuring child below runs without it."""
    out = short_tmp / "gpu_check.json"
    ran = run_smoke("gpu_check.py", "--device", "cpu", "--out", str(out), block=False)
    ran.check()
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["smoke"] is True and doc["failed"] == []
    assert doc["finished"] is True
    tests = doc["phases"]["tests"]
    # the cuda-marked tests were collected, and skipped for want of a device
    assert tests["status"] == "passed" and tests["skipped"] >= 3 and "passed" not in tests
    assert doc["phases"]["demos"]["qwen3_tts_demo.toml"].startswith("ok: ")
    models = {row["model"] for row in doc["table"]}
    assert models == {"Qwen3-TTS tiny", "MOSS-TTS tiny", "Qwen3-Omni tiny"}
    assert {row["concurrency"] for row in doc["table"]} == {1, 2}
    for row in doc["table"]:
        assert row["audio_s_per_s"] > 0 and row["first_audio_ms"] > 0 and row["rtf"] > 0
    tts_alone = next(r for r in doc["table"] if r["model"] == "Qwen3-TTS tiny")
    engine, codec, frame = _frame_split(tts_alone["note"])
    # the engine and the codec take turns on the stage's compute thread
    # (means of a smoke run's few frames: within a few percent, see test_smoke_light)
    assert codec > 0 and engine > 0 and engine + codec <= 1.05 * frame, tts_alone
    moss_alone = next(
        r for r in doc["table"] if r["model"] == "MOSS-TTS tiny" and r["concurrency"] == 1
    )
    engine, codec, frame = _frame_split(moss_alone["note"])
    assert codec > 0 and engine > 0, moss_alone
    assert [p["system"] for p in doc["peers"]] == ["vLLM-Omni", "SGLang-Omni", "SGLang-Omni"]
    assert any("Qwen3-TTS 1.7B" in s for s in doc["skipped"])  # what --smoke left out, said
    assert any(
        "Qwen3-TTS 0.6B compiled (--smoke" in s and "--models qwen3-tts-0.6b-compiled" in s
        for s in doc["skipped"]
    ), doc["skipped"]
    # one profiled pass: counts per engine step, then the operators by their own time
    profile = doc["profiles"]["Qwen3-TTS tiny"]
    assert re.search(r"per engine step \(\d+ steps\): [\d.]+ kernel launches", profile)
    assert "Self CPU" in profile and "aten::" in profile, profile
    assert "Qwen3-TTS tiny, where the time goes (torch.profiler" in ran.stdout
    # and the codec's chunks eagerly and through graphs (the CPU's stand-in), per shape
    assert re.search(r"codec chunks: streamed chunks captured as 4 CUDA graphs", profile)
    assert re.search(r"\n +1 +2 +[\d.]+ +[\d.]+ +[\d.]+x\n +2 +4 +[\d.]+ +[\d.]+", profile)
    # each phase's and model's whole output beside --out, for a lease to bring back
    assert "cuda" in (short_tmp / "gpu_check.tests.log").read_text()
    omni_log = (short_tmp / "gpu_check.qwen3-omni-30b-a3b.log").read_text()
    assert '"model": "Qwen3-Omni tiny", "concurrency": 2' in omni_log, omni_log[-2000:]


def _frame_split(note: str) -> tuple[float, float, float]:
    """The engine's, the codec's and the whole frame's milliseconds a note quotes."""
    split = re.fullmatch(r"engine (\d+\.\d), codec (\d+\.\d) of (\d+\.\d) ms a frame", note)
    assert split, note
    engine, codec, frame = map(float, split.groups())
    return engine, codec, frame


# the smoke run above measures in such children already, under the same guard; this one
# reads a child's file directly (~8 s more): make test-all
@pytest.mark.slow
def test_a_measuring_child_imports_no_pytest(run_smoke, short_tmp):
    out = short_tmp / "rows.json"
    ran = run_smoke(
        "gpu_check.py", "--device", "cpu", "--measure", "qwen3-tts-0.6b", "--out", str(out)
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    measured = json.loads(out.read_text())
    assert [r["concurrency"] for r in measured["rows"]] == [1, 2]
    assert measured["profile"].startswith(
        "where the time goes (torch.profiler, gpu_profile.py) at c=2, 4 frames a request:\n"
        "per engine step"
    )


def _gpu_check(*args: str) -> subprocess.CompletedProcess[str]:
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, check=False
    )


def test_without_a_cuda_device_it_fails_fast_with_exit_2():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the check would run")
    done = _gpu_check()
    assert done.returncode == 2
    assert "no CUDA device here" in done.stderr and "--device cpu --smoke" in done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--device", "cpu"), "--device cpu runs only with --smoke"),
        (("--device", "tpu"), "use cuda, cuda:N, or cpu with --smoke"),
        (("--device", "cpu", "--smoke", "--phases", "tests,speed"), "--phases: unknown"),
        (("--device", "cpu", "--smoke", "--models", "moss-tts-8b,gpt-4"), "unknown gpt-4"),
        (("--device", "cpu", "--smoke", "--models", ","), "--models: none named"),
    ],
)
def test_usage_errors_exit_2_saying_what_to_do(args, said):
    done = _gpu_check(*args)
    assert done.returncode == 2
    assert said in done.stderr


def _stopped_after_the_tests_phase(
    short_tmp, signum: int, in_demos: bool = False
) -> tuple[dict, str, int]:
    """gpu_check.py --phases tests,demos stopped with ``signum`` once the tests phase is
    on disk (``in_demos``: once the demos phase made its work directory) and the demo
    (an omni serve, seconds) has not answered yet; its TMPDIR is under ``short_tmp``:
    (the JSON it left, what it printed, its exit status)."""
    import os
    import signal
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
    out = short_tmp / "partial.json"
    (short_tmp / "tmp").mkdir()
    argv = [sys.executable, str(script), "--device", "cpu", "--smoke", "--out", str(out)]
    argv += ["--phases", "tests,demos"]
    run = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(short_tmp / "tmp")},
    )
    try:
        deadline = time.monotonic() + 240
        while run.poll() is None and time.monotonic() < deadline:
            if out.exists() and (not in_demos or list((short_tmp / "tmp").glob("gpu-check-*"))):
                break
            time.sleep(0.02)
        os.killpg(run.pid, signum)
        said, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    return json.loads(out.read_text()), said, run.returncode


# make test keeps the SIGTERM case above, which ends a run midway as a lease's limit does
@pytest.mark.slow
def test_a_run_killed_midway_leaves_what_it_finished(short_tmp):
    """A GPU lease ends a command at its time limit: the phases done by then are on disk,
    even after SIGKILL."""
    import signal

    doc, _, _ = _stopped_after_the_tests_phase(short_tmp, signal.SIGKILL)
    assert doc["finished"] is False
    assert doc["phases"]["tests"]["status"] == "passed" and "demos" not in doc["phases"]


def test_a_run_stopped_by_sigterm_cleans_up_and_prints_what_it_measured(short_tmp):
    """``timeout`` sends SIGTERM first: the demo's server is stopped, its work directory
    removed, the table so far printed, and the status says it was terminated."""
    import signal

    doc, said, code = _stopped_after_the_tests_phase(short_tmp, signal.SIGTERM, in_demos=True)
    assert code == 143, said
    assert doc["finished"] is False and doc["phases"]["tests"]["status"] == "passed"
    assert "gpu_check stopped by SIGTERM during phase demos" in said
    assert "throughput, first audio and RTF on cpu" in said  # the table, empty so far
    assert list((short_tmp / "tmp").iterdir()) == []  # no gpu-check-* work directory left


def _demos() -> list:
    from pathlib import Path

    return sorted((Path(__file__).resolve().parents[2] / "examples").glob("*_demo.toml"))


@pytest.mark.parametrize("demo", _demos(), ids=lambda p: p.stem)
def test_every_demo_plans_on_one_gpu_with_the_flags_the_check_serves_it_with(demo):
    """The demos phase puts each demo on GPU 0 in bf16: a demo whose config drifted from
    that would fail there, within a GPU lease; planned here against a declared H200."""
    import shutil

    flags, api = _gpu_check_module().demo_flags(demo, "cuda")
    assert api and "--placement.policy" in flags
    omni = shutil.which("omni", path=str(Path(sys.executable).parent))
    assert omni is not None
    argv = [omni, "plan", str(demo), *flags]
    argv += ["--cluster.gpus", "1", "--cluster.gpu_memory", "141GiB"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    on_gpu = [flags[i - 1][2:-4] for i, flag in enumerate(flags) if flag == "0"]
    assert on_gpu, "no stage of the demo was put on the GPU"
    for stage in on_gpu:
        if f"--{stage}.factory.dtype" in flags:
            assert f"precision {stage}: bfloat16 (set)" in done.stdout


def _gpu_check_module():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_models_are_measured_in_the_order_asked_and_the_others_said_left_out():
    """--models puts the model a short lease is for first; the phase's deadline (here spent
    already) leaves each asked-for model out in that order, and the rest as not asked for."""
    check = _gpu_check_module()
    report = check.Report("cpu", smoke=False)
    asked = ("qwen3-omni-30b-a3b", "moss-tts-8b")
    check.phase_throughput(report, check.Clock(0), "cpu", [1], False, asked)
    assert report.skipped == [
        "throughput: Qwen3-TTS 0.6B (not asked for: --models)",
        "throughput: Qwen3-TTS 1.7B (not asked for: --models)",
        "throughput: Qwen3-TTS 0.6B compiled (not asked for: --models)",
        "throughput: Qwen3-Omni 30B-A3B (no time left in the phase)",
        "throughput: MOSS-TTS 8B (no time left in the phase)",
    ]
    assert report.rows == [] and report.failed == []


def test_a_model_killed_at_the_deadline_leaves_the_end_of_what_it_printed():
    check = _gpu_check_module()
    killed = subprocess.TimeoutExpired(
        ["gpu_check.py", "--measure", "qwen3-omni-30b-a3b"],
        60,
        output=b"loading thinker\n" + b"x" * 5000 + b"\ncapturing bucket 8\n",
        stderr=b"engine: capture of bs=8 took 3.1 s\n",
    )
    said = check.said_before_kill(killed, keep=200)
    assert said.startswith("  killed; its last output:")
    assert "capturing bucket 8" in said and "engine: capture of bs=8 took 3.1 s" in said
    assert "loading thinker" not in said  # only the end is kept
    assert all(line.startswith("    ") for line in said.splitlines()[1:])
    nothing = subprocess.TimeoutExpired(["x"], 1, output=None, stderr=None)
    assert check.said_before_kill(nothing).endswith("(nothing)")


@pytest.mark.slow
def test_the_compiled_row_measures_compiled_steps_and_says_when_they_were_ready(
    run_smoke, short_tmp
):
    """The compiled Qwen3-TTS row, tiny on the CPU: the engine compiled its buckets (the
    note quotes its ready line), and it measured the levels asked for up to 8."""
    out = short_tmp / "rows.json"
    ran = run_smoke(
        "gpu_check.py",
        "--device",
        "cpu",
        "--measure",
        "qwen3-tts-0.6b-compiled",
        "--levels",
        "1,2,16",
        "--out",
        str(out),
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["concurrency"] for r in rows] == [1, 2]  # 16: above COMPILED_MAX_LEVEL
    assert {r["model"] for r in rows} == {"Qwen3-TTS tiny compiled"}
    note = rows[0]["note"]
    assert re.fullmatch(
        r"engine \d+\.\d, codec \d+\.\d of \d+\.\d ms a frame; "
        r"torch\.compile for batch sizes 1, 2, ready in \d+\.\d s, \d+ compiled graphs",
        note,
    ), note
    ready = r"torch\.compile for batch sizes 1, 2, ready in \d+\.\d s, \d+ compiled graphs"
    assert re.fullmatch(ready, rows[1]["note"])
    # profiled as the eager row is, through its compiled steps (inductor's kernels)
    profile = json.loads(out.read_text())["profile"]
    assert profile.startswith("where the time goes (torch.profiler, gpu_profile.py) at c=2")
    assert "Self CPU" in profile and "Torch-Compiled Region" in profile, profile


def test_the_ready_note_quotes_the_engines_line_without_its_setting():
    check = _gpu_check_module()
    line = (
        "engine: torch.compile + CUDA graphs for batch sizes 1, 2, 4, 8 "
        "(engine.cuda_graph_max_bs 8; larger batches run eagerly): talker, code_predictor "
        "ready in 42.1 s"
    )
    assert check.ready_note([line]) == (
        "torch.compile + CUDA graphs for batch sizes 1, 2, 4, 8, ready in 42.1 s"
    )
    assert check.ready_note([line + " (6 compiled graphs)"]) == (
        "torch.compile + CUDA graphs for batch sizes 1, 2, 4, 8, ready in 42.1 s, 6 compiled graphs"
    )
    assert check.ready_note([]) == "no compiled steps: the engine printed no ready line"


def test_the_cache_note_quotes_the_engines_cache():
    check = _gpu_check_module()
    lines = ["built", "engine cache: 8 slots of 32768 positions (memory)", "ours ..."]
    assert check.cache_note(lines, "engine cache:") == "cache: 8 slots of 32768 positions (memory)"
    assert check.cache_note(["built"], "engine cache:") == ""


def test_the_memory_note_sets_the_peak_beyond_the_share_beside_what_the_plan_counts():
    check = _gpu_check_module()
    gib = 2**30
    note = check.beyond_share_note(90 * gib, 141 * gib, 0.6, 4 * gib)
    assert note == "memory beyond the engine's 0.6 share: 5.40 GiB at peak (the plan counts 4.00)"
    assert check.beyond_share_note(90 * gib, 141 * gib, 0.6, None).endswith("5.40 GiB at peak")
    assert check.beyond_share("cpu", None, 4 * gib) == ""  # no CUDA: nothing to count
    # the plan's figure: the engine's activations and graphs and the vocoder whole
    from omni_qwen3_tts import memory
    from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

    found = memory.estimate(Qwen3TTSPipeline(model_path="tiny"))
    expected = found["tts_engine"].overhead_bytes + found["vocoder"].total_bytes
    planned = check.planned_beyond_share("omni_qwen3_tts", "Qwen3TTSPipeline", "tiny")
    assert planned == expected
    assert check.planned_beyond_share("omni_qwen3_tts", "NoSuchPipeline", "tiny") is None


def test_the_codec_note_says_how_many_chunk_graphs_or_why_none():
    check = _gpu_check_module()
    said = (
        "vocoder: streamed chunks captured as 15 CUDA graphs (rows x frames: 1 x 4-48, "
        "16 x 4) in 1.3 s, each checked against an eager chunk"
    )
    assert check.codec_note(["built", said]) == "codec: 15 CUDA graphs in 1.3 s"
    refused = "vocoder: chunks not captured, decoded eagerly (RuntimeError: differs)"
    assert check.codec_note([refused]) == "codec: chunks not captured, decoded eagerly " + (
        "(RuntimeError: differs)"
    )
    assert check.codec_note(["built"]) == ""
