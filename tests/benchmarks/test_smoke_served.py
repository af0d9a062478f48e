"""The benchmarks that serve a deployment (a runtime's processes, HTTP), in ``--smoke`` mode."""

from __future__ import annotations

import pytest

GROUP = "served"


# What a plain smoke run must say beside exiting 0, where a default is worth reading back.
SAYS = {
    "bench_qwen3_omni_speech.py": (
        "thinker float32, talker_ar float32, code2wav float32",
        "(1 untimed requests in all)",
    ),
}


def test_benchmark_smoke(run_smoke, benchmark: str) -> None:
    ran = run_smoke(benchmark)
    ran.check()
    for line in SAYS.get(benchmark, ()):
        assert line in ran.stdout, ran.stdout


@pytest.mark.slow  # another served benchmark run: make test-all
def test_the_speech_benchmark_plans_the_precision_it_was_given(run_smoke) -> None:
    """``--dtype`` / ``--quantization`` reach the stages (the line reads the resolved plan;
    the defaults' line is read by the plain smoke run, ``SAYS``)."""
    ran = run_smoke(
        "bench_qwen3_omni_speech.py",
        "--dtype",
        "bfloat16",
        "--quantization",
        "int8",
        "--code2wav-dtype",
        "float32",
        "--warm-each-level",
    )
    ran.check()
    assert "(3 untimed requests in all)" in ran.stdout, ran.stdout  # 1, then 2 before level 2
    planned = "thinker bfloat16 int8, talker_ar bfloat16 int8, code2wav float32"
    assert planned in ran.stdout, ran.stdout
    assert "image_encoder bfloat16, audio_encoder bfloat16" in ran.stdout, ran.stdout


def test_the_speech_benchmark_refuses_int8_in_float32(run_smoke) -> None:
    done = run_smoke("bench_qwen3_omni_speech.py", "--quantization", "int8")
    assert done.returncode == 2, done.stderr
    assert "--quantization int8 computes in bf16: add --dtype bfloat16" in done.stderr
