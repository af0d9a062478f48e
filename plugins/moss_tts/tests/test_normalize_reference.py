"""Our text normaliser against the official MOSS-TTS one (opt-in: ``-m reference``).

MOSS-TTS was trained on text cleaned by ``normalize_tts_text`` of the official
repository, so ``normalize_text`` must give the same string on every input of
``reference/normalize_corpus.json``. The official file needs only the standard
library; it is run in a subprocess by ``reference/normalize_reference.py``, which
loads it by path, so nothing of it is imported into our process.

Runs when ``MOSS_TTS_REF_SRC`` names a directory holding the official checkout as
``MOSS-TTS/``, e.g.::

    mkdir -p /tmp/moss-src/MOSS-TTS
    git -C <MOSS-TTS clone> archive HEAD \\
        moss_tts_delay/tts_robust_normalizer_single_script.py | tar -x -C /tmp/moss-src/MOSS-TTS
    MOSS_TTS_REF_SRC=/tmp/moss-src pytest plugins/moss_tts/tests/test_normalize_reference.py \\
        -m reference
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_moss_tts.normalize import normalize_text

HERE = Path(__file__).parent / "reference"
CORPUS = HERE / "normalize_corpus.json"
SCRIPT = HERE / "normalize_reference.py"
OFFICIAL = (
    Path(os.environ.get("MOSS_TTS_REF_SRC", "/nonexistent/moss-tts-ref"))
    / "MOSS-TTS"
    / "moss_tts_delay"
    / "tts_robust_normalizer_single_script.py"
)

pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(
        not OFFICIAL.is_file(),
        reason="opt-in: set MOSS_TTS_REF_SRC to a directory holding the official "
        "checkout as MOSS-TTS/ (see this file's docstring)",
    ),
]


def _official(inputs: list[str]) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(OFFICIAL)],
        input=json.dumps(inputs),
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    outputs = json.loads(proc.stdout)
    assert len(outputs) == len(inputs)
    return outputs


def test_same_output_as_the_official_normalizer_on_the_whole_corpus() -> None:
    inputs = json.loads(CORPUS.read_text(encoding="utf-8"))
    assert len(inputs) >= 150
    expected = _official(inputs)
    mismatches = [
        f"input:    {text!r}\nofficial: {want!r}\nours:     {got!r}"
        for text, want, got in zip(inputs, expected, map(normalize_text, inputs), strict=True)
        if got != want
    ]
    assert not mismatches, f"{len(mismatches)} of {len(inputs)} differ:\n\n" + "\n\n".join(
        mismatches
    )
