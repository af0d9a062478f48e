"""What the MOSS-TTS reference tests share: where the reference lives, and one run of it.

The reference (OpenMOSS's code on transformers 5.0.0) runs only when asked
for: ``make test-reference`` names its python in ``MOSS_TTS_REF_PYTHON``.
Without it the tests marked ``reference`` skip. (Named apart from the other
families' support modules: every test folder sits on ``sys.path`` in one
session.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REFERENCE_PYTHON = Path(os.environ.get("MOSS_TTS_REF_PYTHON", "/nonexistent/moss-tts-ref"))
HERE = Path(__file__).parent / "reference"

opt_in = [
    pytest.mark.reference,
    pytest.mark.skipif(
        not REFERENCE_PYTHON.exists(),
        reason="opt-in: set MOSS_TTS_REF_PYTHON to the MOSS-TTS reference environment's python "
        "(make test-reference does; see tests/REFERENCE.md)",
    ),
]


def make_clip(path: Path) -> Path:
    """The reference clip (``make_clip.py``, run in our python) at ``path``."""
    subprocess.run([sys.executable, str(HERE / "make_clip.py"), str(path)], check=True)
    return path


def run_reference(out: Path, request: dict) -> Path:
    """The reference writes its tiny checkpoints and recordings for ``request`` under ``out``."""
    (out / "request.json").write_text(json.dumps(request))
    proc = subprocess.run(
        [
            str(REFERENCE_PYTHON),
            str(HERE / "make_reference.py"),
            str(out),
            str(out / "request.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def load(recorded: Path, name: str) -> dict[str, np.ndarray]:
    """One recording (``<name>.npz``) as a dict of arrays."""
    data = np.load(recorded / f"{name}.npz")
    return {k: data[k] for k in data.files}
