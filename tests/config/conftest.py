"""Helpers for the config tests: write deploy files, resolve them, run the CLI."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from omni_core.cli import main
from omni_core.config import load_deployment

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.toml"))

SEED = """\
pipeline = "qwen3-tts"
model_path = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"

[stages.tts_engine.engine]
mem_fraction_static = 0.6

[stages.vocoder.factory]
max_batch_size = 16
"""


@pytest.fixture
def deploy(tmp_path: Path):
    """Write a deploy file and return its path (as a string, the way users type it)."""

    def write(text: str, name: str = "deploy.toml") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return str(path)

    return write


@pytest.fixture
def resolve(plugins):
    def run(deploy_file: str | None, *flags: str, pipeline: str | None = None):
        return load_deployment(deploy_file, list(flags), pipeline=pipeline, plugins=plugins)

    return run


@pytest.fixture
def cli(plugins, capsys):
    """Run ``omni`` in-process as the console script does: (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run
