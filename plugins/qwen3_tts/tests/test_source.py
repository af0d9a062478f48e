"""Hub ids: refused before any process starts, in one line naming the setting, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_qwen3_tts import source

TYPO = "Qwen/Qwen3-TTS-12Hz-0.6B-Bsae"


def omni(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omni_core", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        cwd=cwd,
    )


def deploy(tmp_path: Path, model_path: str) -> Path:
    path = tmp_path / "deploy.toml"
    path.write_text(
        f'pipeline = "qwen3-tts"\nmodel_path = "{model_path}"\n[placement]\npolicy = "cpu"\n'
    )
    return path


@pytest.mark.parametrize("bad", ["Qwen/Qwen3--TTS", "Qwen/-x", "Qwen/a..b", "Qwen/" + "x" * 97])
def test_a_malformed_hub_id_is_a_plan_time_problem(bad):
    (problem,) = source.hub_id_problems(bad, "Qwen/Qwen3-TTS-12Hz-0.6B-Base")
    assert problem[0] == (("model_path",),)
    assert "is not a valid hub id" in problem[1] and "Qwen/Qwen3-TTS-12Hz-0.6B-Base" in problem[2]


def test_offline_and_not_cached_is_a_plan_time_problem_and_cached_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (problem,) = source.hub_id_problems(TYPO, "x/y")
    assert "not in the local Hugging Face cache" in problem[1] and str(tmp_path) in problem[1]
    snapshot = tmp_path / "hub" / f"models--{TYPO.replace('/', '--')}" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    assert source.hub_id_problems(TYPO, "x/y") == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    snapshot.rmdir()
    assert source.hub_id_problems(TYPO, "x/y") == []  # online: serve fetches it


@pytest.mark.parametrize(
    ("error", "says"),
    [
        ("RepositoryNotFoundError", "no such repository"),
        ("LocalEntryNotFoundError", "cannot be reached"),
        ("RevisionNotFoundError", "no such revision"),
    ],
)
def test_a_failed_fetch_says_why_in_one_line(monkeypatch, error, says):
    import huggingface_hub

    failure = type(error, (Exception,), {})

    def fail(*args, **kwargs):
        raise failure("line one\nline two of a long story")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(FileNotFoundError) as caught:
        source.download(TYPO)
    assert says in str(caught.value) and "line two" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_plan_refuses_a_malformed_hub_id_with_exit_2(tmp_path):
    done = omni("plan", str(deploy(tmp_path, "Qwen/Qwen3--TTS")), env={}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "is not a valid hub id" in done.stderr and "deploy.toml:2" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_refuses_a_hub_id_it_cannot_fetch_with_exit_2_and_no_traceback(tmp_path):
    """The typo from the first-hour report: 133 lines of chained traceback, exit 1, before."""
    env = {
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_ENDPOINT": "http://127.0.0.1:9",  # nothing listens: refused at once, no network used
        "HF_HUB_ETAG_TIMEOUT": "2",
    }
    done = omni(
        "serve",
        str(deploy(tmp_path, TYPO)),
        "--port",
        "0",
        "--endpoints.base_path",
        str(tmp_path / "run"),
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert f"could not fetch hub model {TYPO!r}" in done.stderr
    assert "deploy.toml:2" in done.stderr and "fix: check model_path" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) <= 3, done.stderr
