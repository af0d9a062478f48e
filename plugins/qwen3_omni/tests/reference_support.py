"""What every opt-in reference test shares: where the reference lives, and how to run it.

The reference (transformers 4.57.3, and qwen-tts) lives in its own
environment; ``make test-reference`` builds it and names its python in
``QWEN_TTS_REF_PYTHON``. Without it the tests marked ``reference`` skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REFERENCE_PYTHON = Path(os.environ.get("QWEN_TTS_REF_PYTHON", "/nonexistent/qwen-tts-ref"))
SCRIPTS = Path(__file__).parent / "reference"

opt_in = [
    pytest.mark.reference,
    pytest.mark.skipif(
        not REFERENCE_PYTHON.exists(),
        reason="opt-in: set QWEN_TTS_REF_PYTHON to the reference environment's python "
        "(make test-reference does; see plugins/qwen3_omni/tests/REFERENCE.md)",
    ),
]


def run_reference(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``reference/<script>`` with the reference's python, one thread; fail with its stderr."""
    proc = subprocess.run(
        [str(REFERENCE_PYTHON), str(SCRIPTS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
