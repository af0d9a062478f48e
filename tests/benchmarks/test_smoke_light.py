"""The quick benchmarks in ``--smoke`` mode, and the checks of the smoke runs themselves.

Every script no other module of this directory takes runs here (a new one
too), each in a fresh interpreter with pytest unimportable: see conftest.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

GROUP = "light"


def test_benchmark_smoke(run_smoke, benchmark: str) -> None:
    run_smoke(benchmark).check()


def test_a_covered_scripts_plain_run_is_left_only_where_a_test_runs_it_more(covered_scripts):
    """conftest.COVERED names, for each script whose plain smoke run it leaves to make
    test-all, the test here that runs it with --smoke and more, and checks the run."""
    import inspect

    source = inspect.getsource(sys.modules[__name__])
    for script, test in covered_scripts.items():
        parts = source.split(f"def {test}(", 1)
        assert len(parts) == 2, f"{test} (conftest.COVERED) is not a test of this module"
        body = parts[1].split("\ndef ", 1)[0]
        assert f'run_smoke("{script}"' in body and ".check()" in body, (script, test)


def test_pytest_is_really_unimportable_in_the_smoke_runs(no_pytest_path, shipped_plugins_env):
    """The guard itself: a script that imports pytest fails under it."""
    env = {**shipped_plugins_env, "PYTHONPATH": str(no_pytest_path)}
    done = subprocess.run(
        [sys.executable, "-c", "import omni_core.harness; import pytest"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "a benchmark must not import pytest" in done.stderr


def test_the_harness_imports_without_pytest_and_testing_re_exports_it(
    no_pytest_path, shipped_plugins_env
):
    """Benchmarks use omni_core.harness; omni_core.testing (pytest's side) is the same objects."""
    env = {**shipped_plugins_env, "PYTHONPATH": str(no_pytest_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from omni_core.harness import plan_on_cpu, LiveServer; print('ok')",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    import omni_core.harness as harness
    import omni_core.testing as testing

    for name in ("LiveServer", "PlannedDeployment", "plan_on_cpu", "short_private_dir"):
        assert getattr(testing, name) is getattr(harness, name)


def assert_step_split(stdout: str) -> None:
    """The step split into its weight-reading ops, run again alone, and the rest
    (``roofline.kernels_line``); the rest may come out below zero on a busy machine."""
    split = re.search(
        r"its (\d+) weight-reading ops alone, run again back to back: \d+\.\d+ ms "
        r"\(\d+\.\d+ GB/s of weights, \d+% of the limit\); the rest of the step .*: "
        r"-?\d+\.\d+ ms",
        stdout,
    )
    assert split and int(split.group(1)) > 0, stdout


@pytest.mark.slow  # three more model benchmark runs (~30 s of CPU): make test-all
def test_model_benchmarks_run_in_bf16_with_int8_and_print_the_bandwidth_limit(run_smoke) -> None:
    """``--dtype bfloat16 --quantization int8``: the stages' factory settings, the limit printed."""
    thinker = run_smoke(
        "bench_qwen3_omni_thinker.py", "--dtype", "bfloat16", "--quantization", "int8"
    )
    thinker.check()
    assert "ours int8" in thinker.stdout, thinker.stdout
    # "ours: N linear layers packed ..., M int8, K with float16 row copies; ..."
    converted = re.search(r"packed for oneDNN in all, (\d+) int8,", thinker.stdout)
    assert converted and int(converted.group(1)) > 0, thinker.stdout
    moss = run_smoke("bench_moss_tts.py", "--dtype", "bfloat16", "--quantization", "int8")
    moss.check()
    assert "bfloat16, quantization int8" in moss.stdout, moss.stdout
    tts = run_smoke("bench_qwen3_tts.py", "--dtype", "bfloat16", "--quantization", "int8")
    tts.check()
    assert "our frame at concurrency 1 vs the memory-bandwidth limit" in tts.stdout, tts.stdout
    assert "bfloat16 (codec bfloat16)" in tts.stdout, tts.stdout  # --codec-dtype follows --dtype
    for ran in (thinker, moss, tts):
        assert re.search(
            r"reads \d+\.\d+ GB of weights \+ \d+\.\d+ MB of KV per step; at the limit "
            r"\(\d+\.\d+ GB/s.*measured step \d+\.\d+ ms: \d+% of the memory-bandwidth limit",
            ran.stdout,
        ), ran.stdout
        assert_step_split(ran.stdout)


@pytest.mark.slow  # two more model benchmark runs: make test-all (tests/engine/test_w8a8.py stays)
def test_model_benchmarks_run_with_w8a8_int8_layers(run_smoke) -> None:
    """``--quantization w8a8_int8``: int8 activations too, in float32 as in bf16."""
    thinker = run_smoke(
        "bench_qwen3_omni_thinker.py", "--dtype", "bfloat16", "--quantization", "w8a8_int8"
    )
    thinker.check()
    converted = re.search(r"packed for oneDNN in all, (\d+) w8a8_int8,", thinker.stdout)
    assert converted and int(converted.group(1)) > 0, thinker.stdout
    moss = run_smoke("bench_moss_tts.py", "--quantization", "w8a8_int8")
    moss.check()
    assert "float32, quantization w8a8_int8" in moss.stdout, moss.stdout


@pytest.mark.slow  # inductor compiles the tiny thinker's buckets (~15 s here): make test-all
def test_the_thinker_benchmark_prints_a_compiled_run_measured_and_projected(run_smoke) -> None:
    """``--compile``: a compiled run after eager, its tokens/s and its projection to the
    release's layers beside eager's, one row per level."""
    ran = run_smoke("bench_qwen3_omni_thinker.py", "--dtype", "bfloat16", "--compile")
    ran.check()
    assert "projected to 48 layers with eager's time outside the layers" in ran.stdout
    rows = re.findall(
        r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+x\s+-\s+[\d.]+\s+[\d.]+x\s+-$",
        ran.stdout,
        re.MULTILINE,
    )
    assert rows == ["1", "2"], ran.stdout


@pytest.mark.slow  # another model benchmark run: make test-all
def test_the_qwen3_tts_codec_dtype_can_differ_from_the_talkers(run_smoke) -> None:
    ran = run_smoke("bench_qwen3_tts.py", "--dtype", "bfloat16", "--codec-dtype", "float32")
    ran.check()
    assert "bfloat16 (codec float32)" in ran.stdout, ran.stdout
    # a frame at concurrency 1 split: engine and codec take turns on the compute thread
    split = re.search(
        r"a frame at concurrency 1: ([\d.]+) ms, of which engine ([\d.]+), codec ([\d.]+), "
        r"rest (-?[\d.]+)",
        ran.stdout,
    )
    assert split, ran.stdout
    frame, engine, codec, rest = map(float, split.groups())
    # the engine's share is its mean call, the frame a level's wall time over its frames:
    # a smoke run's four frames let the two means part (a CI run under load printed rest
    # -0.7 of 40.4 ms; four workers on two cores -6.9 of 76.4), so the split is checked
    # for what it says, not for how steady the machine was: its parts add up to the frame
    assert engine > 0 and codec > 0, ran.stdout
    assert engine + codec + rest == pytest.approx(frame, abs=0.15), ran.stdout


# the stage's bf16 codec is plugins/moss_tts/tests/test_codec_dtype.py's in make test; the
# benchmark's flag for it, another MOSS-TTS smoke run, is make test-all's
@pytest.mark.slow
def test_the_moss_codec_runs_in_bf16_when_asked(run_smoke) -> None:
    """``--codec-dtype bfloat16``: the vocoder stage's factory.dtype, read back off its weights."""
    ran = run_smoke("bench_moss_tts.py", "--dtype", "bfloat16", "--codec-dtype", "bfloat16")
    ran.check()
    assert "bfloat16 (quantization none, codec bfloat16)" in ran.stdout, ran.stdout
    # without --codec-dtype the codec stays float32 whatever the backbone's dtype:
    # plugins/moss_tts/tests/test_codec_dtype.py reads that off the stage itself


def _usage_error(load_script, capsys, script: str, *args: str) -> str:
    """``script``'s command line checked in this process (its ``arguments()``, which
    ``main()`` calls first): it must exit 2; what it printed to stderr."""
    with load_script(script) as bench, pytest.raises(SystemExit) as exited:
        bench.arguments(["--smoke", *args])
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_int8_without_bf16_is_a_usage_error(load_script, capsys) -> None:
    """int8 weight-only layers compute in bf16: float32 with int8 exits 2 and says what to set."""
    said = _usage_error(load_script, capsys, "bench_moss_tts.py", "--quantization", "int8")
    assert "--quantization int8" in said and 'factory.dtype = "bfloat16"' in said


@pytest.mark.parametrize(
    "script", ["bench_qwen3_tts.py", "bench_qwen3_omni_thinker.py", "bench_moss_tts.py"]
)
def test_float16_row_copies_of_float32_weights_are_a_usage_error(
    load_script, capsys, script
) -> None:
    """The copies are of bf16 weights: float32 with --fp16-row-weights exits 2 saying so."""
    said = _usage_error(load_script, capsys, script, "--fp16-row-weights")
    assert "--fp16-row-weights copies" in said and "--dtype bfloat16" in said


@pytest.mark.parametrize("script", ["bench_qwen3_tts.py", "bench_moss_tts.py"])
def test_prepacking_without_compiling_is_a_usage_error(load_script, capsys, script) -> None:
    """``--cpu-weight-prepack`` packs weights into compiled steps: alone it exits 2, saying so."""
    said = _usage_error(load_script, capsys, script, "--cpu-weight-prepack")
    assert "--cpu-weight-prepack packs weights into compiled steps: add --compile" in said


def test_a_script_started_with_a_mistake_exits_2_before_it_builds(run_smoke) -> None:
    """The same check from the command line, once: ``main()`` reads ``arguments()`` first."""
    done = run_smoke("bench_moss_tts.py", "--cpu-weight-prepack")
    assert done.returncode == 2, done.stderr
    assert "add --compile" in done.stderr and "Traceback" not in done.stderr


def test_the_speech_benchmark_reports_what_each_engine_stage_said_of_its_static_steps(
    tmp_path, monkeypatch
):
    """The GPU check's Qwen3-Omni row says whether the thinker and talker were captured:
    the ``engine:`` lines of each stage's whole log (the startup lines leave the tail)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_qwen3_omni_speech as bench

    log = tmp_path / "thinker.log"
    startup = "engine: CUDA graphs for batch sizes 1, 2: thinker ready in 3.1 s"
    chunks = "code2wav: streamed chunks captured as 15 CUDA graphs (rows x frames: 1 x 4-48)"
    log.write_text(f"loading\n{startup}\n{chunks}\n" + "served a request\n" * 50)

    class Child:
        log_path = str(log)

        def log_tail(self) -> str:
            raise AssertionError("the whole log is there to read")

    class Remote:
        log_path = str(tmp_path / "absent.log")

        def log_tail(self) -> str:
            return "engine: eager decode (engine.disable_cuda_graph)\nother"

    said = {"thinker": bench.engine_lines(bench.whole_log(Child()))}
    said["talker_ar"] = bench.engine_lines(bench.whole_log(Remote()))
    said["decode"] = bench.engine_lines("no engine here")
    assert said["thinker"] == [startup, chunks]
    assert said["talker_ar"] == ["engine: eager decode (engine.disable_cuda_graph)"]
    text = bench.engine_report({"engine": {k: v for k, v in said.items() if v}})
    assert text is not None
    assert "  thinker: CUDA graphs for batch sizes 1, 2: thinker ready in 3.1 s" in text
    assert bench.engine_report({"engine": {}}) is None


# two fresh interpreters (3 s); the script's --smoke runs on the CPU twice in make test
@pytest.mark.slow
def test_the_codec_graph_benchmark_has_nothing_to_time_without_cuda_and_says_so() -> None:
    """``make bench`` runs every script bare: without CUDA this one exits 0 saying why; asked
    for a CUDA device that is not there, it is a usage error (exit 2)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: run bare, the benchmark would measure")
    script = Path(__file__).parents[2] / "benchmarks" / "bench_codec_graphs.py"
    bare = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert bare.returncode == 0, bare.stderr
    assert "no CUDA device here: no CUDA graph to time" in bare.stdout
    asked = subprocess.run(
        [sys.executable, str(script), "--device", "cuda"], capture_output=True, text=True
    )
    assert asked.returncode == 2
    assert "--device cuda: torch sees no CUDA device here (try --smoke)" in asked.stderr


def test_the_codec_graph_benchmark_times_the_moss_codecs_chunks_too(run_smoke) -> None:
    """``--codec moss-tts``: the MOSS codec's own graphs (full windows, shared), each shape
    timed both ways on streams decoded a few frames in first."""
    ran = run_smoke("bench_codec_graphs.py", "--codec", "moss-tts")
    ran.check()
    assert "captured as 4 CUDA graphs (rows x frames: 1 x 2-8, 2 x 2-8; full windows of 2 " in (
        ran.stdout
    )
    shapes = re.findall(r"^ +(\d+) +(\d+) +[\d.]+ +[\d.]+ +[\d.]+x$", ran.stdout, re.MULTILINE)
    assert shapes == [("1", "2"), ("2", "8")], ran.stdout


def test_the_qwen3_tts_sides_alternate_and_each_keeps_its_fastest_round(run_smoke) -> None:
    ran = run_smoke("bench_qwen3_tts.py", "--rounds", "2")
    ran.check()
    rounds = re.findall(
        r"^round (\d)/2: baseline ([\d.]+) audio s/s; ours c1 ([\d.]+) \([\d.]+x\), "
        r"c2 ([\d.]+)",
        ran.stdout,
        re.MULTILINE,
    )
    assert [r[0] for r in rounds] == ["1", "2"], ran.stdout
    baseline = max(float(r[1]) for r in rounds)
    ours = {1: max(float(r[2]) for r in rounds), 2: max(float(r[3]) for r in rounds)}
    reported = dict(
        (int(c), float(rate))
        for c, rate in re.findall(r"^ +(\d) +[\d.]+ +[\d.]+ +([\d.]+) ", ran.stdout, re.MULTILINE)
    )
    assert reported == pytest.approx(ours, abs=1e-3), ran.stdout
    assert f"{baseline:.3f} audio s/s, RTF" in ran.stdout, ran.stdout
    assert_step_split(ran.stdout)


def test_the_thinker_benchmark_keeps_each_levels_fastest_round(run_smoke) -> None:
    """``--rounds 2`` (ours alone under --smoke): both rounds printed, and the table holds
    each level's fastest of them."""
    ran = run_smoke("bench_qwen3_omni_thinker.py", "--rounds", "2")
    ran.check()
    rounds = re.findall(
        r"^round (\d)/2: decode tokens/s ours mixed c1 ([\d.]+), c2 ([\d.]+)$",
        ran.stdout,
        re.MULTILINE,
    )
    assert [r[0] for r in rounds] == ["1", "2"], ran.stdout
    best = {1: max(float(r[1]) for r in rounds), 2: max(float(r[2]) for r in rounds)}
    table = dict(
        (int(c), float(rate))
        for c, rate in re.findall(r"^ +ours mixed +(\d) +([\d.]+) ", ran.stdout, re.MULTILINE)
    )
    assert table == pytest.approx(best, abs=0.06), ran.stdout
    assert_step_split(ran.stdout)


def test_the_model_benchmarks_spell_their_rounds_alike(load_script, capsys) -> None:
    """``--rounds N`` in all three (MOSS-TTS's ``--repeats`` kept as its other name)."""
    helps = {}
    for script in ("bench_qwen3_tts.py", "bench_qwen3_omni_thinker.py", "bench_moss_tts.py"):
        with load_script(script) as bench, pytest.raises(SystemExit) as exited:
            bench.arguments(["--help"])
        assert exited.value.code == 0
        helps[script] = capsys.readouterr().out
        assert re.search(r"--rounds (N|ROUNDS)\b", helps[script]), helps[script]
    assert "--rounds N, --repeats N" in helps["bench_moss_tts.py"]
