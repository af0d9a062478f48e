"""Fixtures for the Qwen3-Omni plugin's tests: the core's testing helpers, media samples."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # media_samples

from omni_core.testing import short_tmp  # noqa: F401 - a fixture
