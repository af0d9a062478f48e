"""What the stages would refuse is refused before any process starts, by every command.

Each case once passed `omni plan` and then died in a child process with a
traceback (or was accepted and blamed the client later). Now each exits 2
from `omni config resolve`, `omni plan` and `omni serve` alike, naming the
setting, who wrote it, and the fix.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

OMNI = [sys.executable, "-m", "omni_core"]


def omni(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*OMNI, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


CASES = {
    "an undeclared factory key": (
        ["--vocoder.factory.bogus", "1"],
        [
            "'bogus' is not a setting of this stage's factory",
            "(set by --vocoder.factory.bogus)",
            "fix: remove it, or correct its name",
        ],
    ),
    "a misspelt factory key": (
        ["--vocoder.factory.max_batch_sise", "4"],
        ["did you mean: max_batch_size"],
    ),
    "a load format no loader knows": (
        ["--tts_engine.factory.load_format", "evil"],
        ["--tts_engine.factory.load_format", "expected one of 'auto', 'safetensors', 'dummy'"],
    ),
    "a negative frame cap": (
        ["--preprocessing.factory.max_frames", "-3"],
        [
            "factory.max_frames: must be >= 1, got -3",
            "(set by --preprocessing.factory.max_frames)",
            "fix: write a value >= 1",
        ],
    ),
    "a model path that does not exist": (
        ["--model-path", "/nonexistent"],
        ["model_path '/nonexistent' is neither a directory", "(set by --model-path)", "fix: "],
    ),
    "the tiny preset without dummy weights": (
        ["--model-path", "tiny"],
        ['needs factory.load_format = "dummy"', "fix: --tts_engine.factory.load_format dummy"],
    ),
    "the plan's old name for a memory share": (
        ["--tts_engine.memory_fraction", "0.5"],
        ["has no field 'memory_fraction'", "did you mean: gpu_memory_fraction"],
    ),
    "a transport nobody registered": (
        ["--runtime.transport", "nosuch"],
        ["no plugin provides a transport called 'nosuch'", "(set by --runtime.transport)"],
    ),
    "an empty body limit": (
        ["--server.max_body_bytes", "0"],
        ["max_body_bytes must be >= 1 byte, got 0", "(set by --server.max_body_bytes)"],
    ),
    "an engine memory share above one": (
        ["--tts_engine.engine.mem_fraction_static", "1.5"],
        [
            "engine.mem_fraction_static: must be <= 1.0, got 1.5",
            "(set by --tts_engine.engine.mem_fraction_static)",
        ],
    ),
    "a media directory that does not exist": (
        ["--server.media_dirs", '["/no/such/dir"]'],
        ["server.media_dirs[0] '/no/such/dir' does not exist", "(set by --server.media_dirs)"],
    ),
}


@pytest.mark.parametrize(
    "command",
    [["config", "resolve"], ["plan"], ["serve", "--port", "0"]],
    ids=["resolve", "plan", "serve"],
)
@pytest.mark.parametrize("case", list(CASES))
def test_refused_with_exit_2_the_origin_and_no_traceback(command, case):
    flags, says = CASES[case]
    done = omni(*command, "--pipeline", "qwen3-tts", *flags)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    for words in says:
        assert words in done.stderr, done.stderr
    assert "fix: " in done.stderr or "hint: " in done.stderr, done.stderr


def test_an_engine_refusal_blames_only_the_key_at_fault():
    """The deploy file writes mem_fraction_static (line 6); the flag is what is wrong."""
    deploy = Path(__file__).parents[2] / "examples" / "qwen3_tts.toml"
    done = omni("plan", str(deploy), "--tts_engine.engine.max_running_requests", "0")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "(set by --tts_engine.engine.max_running_requests)" in done.stderr, done.stderr
    assert f"{deploy}:6" not in done.stderr
    assert "fix: set --tts_engine.engine.max_running_requests" in done.stderr


def test_a_file_value_is_blamed_on_its_line(tmp_path):
    deploy = tmp_path / "deploy.toml"
    deploy.write_text('pipeline = "qwen3-tts"\nmodel_path = "tiny"\n')
    done = omni("plan", str(deploy))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"(set by {deploy}:2)" in done.stderr


def test_serve_refuses_before_it_loads_anything(tmp_path):
    done = omni("serve", "--pipeline", "qwen3-tts", "--model-path", "tiny", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert 'needs factory.load_format = "dummy"' in done.stderr
    assert "loading" not in done.stderr and "Traceback" not in done.stderr


def test_the_built_in_demo_is_still_accepted():
    demo = Path(__file__).parents[2] / "examples" / "qwen3_tts_demo.toml"
    done = omni("plan", str(demo))
    assert done.returncode == 0, done.stderr
