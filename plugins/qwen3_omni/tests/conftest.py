"""The Qwen3-Omni plugin's tests import media samples from here (the core's testing
fixtures come from the repository's top-level conftest)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # media_samples
