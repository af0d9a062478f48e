"""Spoken clips (espeak-ng: real speech, not a tone) for the Qwen3-ASR plugin's tests.

omni's own fixtures (``plugins``, ``short_tmp``) come from the repository's conftest.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import pytest


@pytest.fixture(scope="session")
def speak(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], bytes]:
    """``speak(text)``: the text spoken by espeak-ng, as WAV bytes (22.05 kHz mono)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    directory = tmp_path_factory.mktemp("speech")

    def say(text: str) -> bytes:
        path = directory / f"{abs(hash(text))}.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
        return path.read_bytes()

    return say


@pytest.fixture(scope="session")
def hello_wav(speak: Callable[[str], bytes]) -> bytes:
    return speak("hello world, this is a test")
