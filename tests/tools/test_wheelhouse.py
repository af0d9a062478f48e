"""``tools/wheelhouse.py`` and ``tools/gpu_check_offline.sh``: omni onto a GPU host without network.

What can fail here without an index: the omni wheels (built from this tree,
no download), what they ask the wheelhouse to fetch, the command line's
refusals, and the offline runner's set-up checks. The download itself is
pip's; it ran when the tool was written (``make wheelhouse``: 25 wheels,
10.7 MiB for the CUDA image of ``tools/gpu_image_packages.txt``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "wheelhouse.py"
OFFLINE = REPO / "tools" / "gpu_check_offline.sh"


@pytest.fixture(scope="module")
def wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(wheelhouse, tmp_path_factory):
    """The whole tool, run with every dependency counted as present: nothing to download."""
    out = tmp_path_factory.mktemp("wh") / "wheels"
    present = out.parent / "present.txt"
    # This environment's distributions, the target's stand-in: the tool must fetch nothing.
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    present.write_text(freeze + "torch\nopenai\nnvidia-ml-py\n")
    before = _build_output()
    done = subprocess.run(
        [sys.executable, str(TOOL), "--out", str(out), "--present", str(present)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PIP_NO_INDEX": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _build_output() == before, "the tool built in the checkout"
    return out, done.stdout


def _build_output() -> set[Path]:
    """What setuptools leaves in a source tree it builds in (``build/``)."""
    return {p for p in [REPO / "build", *(REPO / "plugins").glob("*/build")] if p.exists()}


def test_present_lists_are_read_as_pip_compares_names(wheelhouse, tmp_path):
    listing = tmp_path / "present.txt"
    listing.write_text("# the image\nTyping_Extensions==4.16.0\n\nnvidia.ml-py  # NVML\ntorch>=2\n")
    assert wheelhouse.read_present(listing) == {"typing-extensions", "nvidia-ml-py", "torch"}


def test_omni_and_every_plugin_are_built_whole(built):
    out, printed = built
    wheels = {p.name.split("-", 1)[0]: p for p in out.glob("*.whl")}
    plugins = sorted(p.parent.name for p in (REPO / "plugins").glob("*/pyproject.toml"))
    assert set(wheels) == {"omni_core", *(f"omni_{name}" for name in plugins)}
    assert f"{len(wheels)} wheels" in printed
    # every file of each package (code, presets, templates) is in its wheel
    for name, wheel in wheels.items():
        source = REPO / name if name == "omni_core" else REPO / "plugins" / name[5:] / name
        expected = {
            p.relative_to(source.parent).as_posix()
            for p in source.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        with zipfile.ZipFile(wheel) as archive:
            missing = expected - set(archive.namelist())
        assert not missing, f"{wheel.name} lacks {sorted(missing)[:5]}"
    assert not list(out.parent.glob(".wheels-*")), "the staging folder was left behind"


def test_the_missing_requirements_are_omnis_less_what_the_target_has(wheelhouse, built):
    out, _ = built
    ours = sorted(out.glob("omni_*.whl"))
    wanted = wheelhouse.missing_requirements(ours, {"torch", "numpy"})
    names = {wheelhouse.requirement_name(r) for r in wanted}
    # the core's runtime needs, its gpu extra, and what collecting the tests imports
    assert {"pydantic", "starlette", "uvicorn", "nvidia-ml-py", "openai", "soxr"} <= names
    assert not names & {"torch", "numpy"}
    assert not any(n.startswith("omni-") for n in names)
    assert "ray" not in names  # an extra the GPU check does not use
    less = wheelhouse.missing_requirements(ours, {"torch", "pydantic", "av", "playwright"})
    assert not {wheelhouse.requirement_name(r) for r in less} & {"pydantic", "av", "playwright"}


@pytest.mark.parametrize(
    "args, said",
    [
        (["--python-version", "312"], "--python-version: '312' is not major.minor"),
        (["--present", "/nonexistent/list.txt"], "is not a file"),
    ],
)
def test_bad_arguments_exit_2_saying_what_is_wrong(args, said):
    done = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_a_present_list_without_torch_is_refused(tmp_path):
    listing = tmp_path / "present.txt"
    listing.write_text("numpy\n")
    done = subprocess.run(
        [sys.executable, str(TOOL), "--present", str(listing), "--out", str(tmp_path / "w")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "does not list torch" in done.stderr
    assert not (tmp_path / "w").exists()


def _offline(tmp_path: Path, wheels: Path, cwd: Path = REPO, **env: str):
    return subprocess.run(
        ["bash", str(OFFLINE), "--device", "cpu", "--smoke"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "WHEELS": str(wheels), "SITE": str(tmp_path / "site"), **env},
    )


def test_the_offline_runner_says_what_is_missing_before_installing(tmp_path):
    empty = tmp_path / "none"
    empty.mkdir()
    done = _offline(tmp_path, empty)
    assert done.returncode == 3
    assert "no omni wheels in" in done.stderr and "make wheelhouse" in done.stderr
    done = _offline(tmp_path, empty, cwd=tmp_path)
    assert done.returncode == 3 and "repository root" in done.stderr
    (empty / "omni_core-0.1.0-py3-none-any.whl").write_bytes(b"")
    python = tmp_path / "python3"  # a Python without torch
    python.write_text('#!/bin/sh\nexec /usr/bin/env -i /usr/bin/python3 -I "$@"\n')
    python.chmod(0o755)
    done = _offline(tmp_path, empty, PYTHON=str(python))
    assert done.returncode == 3 and "cannot import torch" in done.stderr
    assert not (tmp_path / "site").exists()
