"""The MOSS-TTS tests' folder on ``sys.path``, for their shared ``moss_reference_support``.

pytest imports test modules with ``--import-mode=importlib``, which puts no
test folder on the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # moss_reference_support
