"""The kit's plan-time modules import no ML framework; its torch modules stay out of them."""

from __future__ import annotations

import subprocess
import sys

LIGHT = (
    "omni_core.kit",
    "omni_core.kit.source",
    "omni_core.kit.pipeline",
    "omni_core.kit.plugin",
    "omni_core.kit.memory",
    "omni_core.kit.config",
    "omni_core.kit.stages",  # torch only inside torch_device
    "omni_core.kit.weights",  # torch only inside its functions
)


def test_the_torch_free_kit_modules_import_neither_torch_nor_numpy():
    script = (
        f"import importlib, sys\nfor m in {LIGHT!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
