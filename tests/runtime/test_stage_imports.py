"""What a stage process imports before it builds anything stays cheap.

A stage process is a fork of a server that has imported torch alone
(``launchers.local.PRELOAD``): every module it imports after that is paid
again by each of a deployment's processes (seven for Qwen3-Omni) and at each
restart. Dynamo is the costly one: ``torch.compiler.disable`` as a decorator
imports it when the decorated module loads, 1.4 s of CPU a process, which
doubled the Qwen3-Omni demo's start (5.8-7.7 s to ready, 10-14 s of CPU,
against 2.8-2.9 s and 4-5 s without). A compiled step imports it when it
compiles, where it is needed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

#: omni_core and the bundled model plugins; SGLang's adapters and the test fixtures aside
PACKAGES = ("omni_core", "omni_qwen3_omni", "omni_qwen3_tts", "omni_moss_tts", "omni_qwen3_asr")

PROBE = """
import importlib, pkgutil, sys
found = []
for name in sys.argv[1:]:
    root = importlib.import_module(name)
    for info in pkgutil.walk_packages(root.__path__, name + "."):
        if "sglang" in info.name or ".testing" in info.name or info.name.endswith("__main__"):
            continue
        before = "torch._dynamo" in sys.modules
        importlib.import_module(info.name)
        if not before and "torch._dynamo" in sys.modules:
            found.append(info.name)
print("DYNAMO", " ".join(found) or "-")
"""


def test_no_module_a_stage_process_imports_loads_dynamo():
    installed = [p for p in PACKAGES if importlib.util.find_spec(p) is not None]
    assert "omni_core" in installed
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *installed], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("DYNAMO "))
    assert line == "DYNAMO -", f"these modules import torch._dynamo when they load: {line[7:]}"


def test_the_probe_names_a_module_that_loads_dynamo(tmp_path):
    """The check above can fail: a module decorated with torch.compiler.disable is named."""
    package = tmp_path / "dynamo_at_import"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "eager.py").write_text(
        "import torch\n\n@torch.compiler.disable\ndef kept_out(x):\n    return x\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "dynamo_at_import"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DYNAMO dynamo_at_import.eager" in done.stdout
