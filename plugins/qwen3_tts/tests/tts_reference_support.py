"""What the Qwen3-TTS reference tests share: where the reference lives, and one run of it.

The reference (``qwen-tts``) pins its own transformers, so it runs only when
asked for: ``make test-reference`` names its python in ``QWEN_TTS_REF_PYTHON``.
Without it the tests marked ``reference`` skip. (Named apart from Qwen3-Omni's
``reference_support``: both test folders sit on ``sys.path`` in one session.)
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from omni_qwen3_tts.weights import PRESETS_DIR

REFERENCE_PYTHON = Path(os.environ.get("QWEN_TTS_REF_PYTHON", "/nonexistent/qwen-tts-ref"))
SCRIPT = Path(__file__).parent / "reference" / "make_reference.py"

opt_in = [
    pytest.mark.reference,
    pytest.mark.skipif(
        not REFERENCE_PYTHON.exists(),
        reason="opt-in: set QWEN_TTS_REF_PYTHON to the reference environment's python "
        "(make test-reference does; see tests/REFERENCE.md)",
    ),
]


def run_reference(tmp_path: Path, request: dict) -> tuple[Path, dict[str, np.ndarray]]:
    """The reference writes the tiny preset's checkpoint and its outputs for ``request``."""
    out = tmp_path / "ckpt"
    request_path = tmp_path / "request.json"
    request_path.write_text(json.dumps(request))
    proc = subprocess.run(
        [
            str(REFERENCE_PYTHON),
            str(SCRIPT),
            str(PRESETS_DIR / "tiny"),
            str(out),
            str(request_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = np.load(out / "reference_outputs.npz")
    return out, {k: data[k] for k in data.files}
