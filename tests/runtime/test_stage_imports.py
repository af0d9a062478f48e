"""What a stage process imports before it is ready stays cheap.

A stage process is a fork of a server that has imported torch alone
(``launchers.local.PRELOAD``): every module it imports after that is paid
again by each of a deployment's processes (seven for Qwen3-Omni) and at each
restart. Two of torch's are costly, and only compiling needs them:

- dynamo (1.1-1.4 s of CPU): ``torch.compiler.disable`` as a decorator imports
  it when the decorated module loads, which doubled the Qwen3-Omni demo's start
  (5.8-7.7 s to ready, 10-14 s of CPU, against 2.8-2.9 s and 4-5 s without);
  and on the meta device some kernels are Python references whose first call
  imports it (an embedding's ``normal_``, a division, ``weight_norm``);
- sympy (0.5 s), through ``torch.fx``'s symbolic shapes, which
  ``Module.to_empty`` imports for a model built on the meta device.

The two cost the Qwen3-TTS and MOSS-TTS demos 0.6-1.0 s of their 3-4 s to ready.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: What no stage process should import unless it compiles.
COSTLY = ("torch._dynamo", "sympy")

#: omni_core and the bundled model plugins; SGLang's adapters and the test fixtures aside
PACKAGES = ("omni_core", "omni_qwen3_omni", "omni_qwen3_tts", "omni_moss_tts", "omni_qwen3_asr")

PROBE = """
import importlib, pkgutil, sys
COSTLY = COSTLY_NAMES
found = []
for name in sys.argv[1:]:
    root = importlib.import_module(name)
    for info in pkgutil.walk_packages(root.__path__, name + "."):
        if "sglang" in info.name or ".testing" in info.name or info.name.endswith("__main__"):
            continue
        before = {c for c in COSTLY if c in sys.modules}
        importlib.import_module(info.name)
        found += [f"{info.name}({c})" for c in COSTLY if c in sys.modules and c not in before]
print("LOADED", " ".join(found) or "-")
""".replace("COSTLY_NAMES", repr(COSTLY))


#: Each bundled family's demo (tiny presets, dummy weights), and the package it needs.
DEMOS = {
    "moss_tts_demo.toml": "omni_moss_tts",
    "qwen3_asr_demo.toml": "omni_qwen3_asr",
    "qwen3_omni_demo.toml": "omni_qwen3_omni",
    "qwen3_omni_text_demo.toml": "omni_qwen3_omni",
    "qwen3_tts_demo.toml": "omni_qwen3_tts",
}

#: Builds and starts every stage of each deploy file given, in declaration order, as a
#: stage process does (worker.Worker.build), and names the first to load each costly one.
BUILD_PROBE = """
import inspect, sys
from pathlib import Path
import anyio
from omni_core.config import load_deployment
from omni_core.factory import StageContext
from omni_core.plugins import OmniPlugins
from omni_core.runtime.stage_api import as_stage

async def main(paths):
    plugins = OmniPlugins(env={})
    costly = COSTLY_NAMES
    found = []
    for path in paths:
        config = load_deployment(path, plugins=plugins).config
        for stage in config.stages:
            before = {c for c in costly if c in sys.modules}
            context = StageContext(instance=stage.name, process="probe")
            built = as_stage(plugins.build_stage(stage, config, context), name=stage.name)
            start = getattr(built, "start", None)
            if start is not None and inspect.isawaitable(started := start()):
                await started
            if getattr(built, "aclose", None) is not None:
                await built.aclose()
            loaded = [c for c in costly if c in sys.modules and c not in before]
            found += [f"{Path(path).name}:{stage.name}({c})" for c in loaded]
    print("LOADED", " ".join(found) or "-")

anyio.run(main, sys.argv[1:])
""".replace("COSTLY_NAMES", repr(COSTLY))


def test_no_module_a_stage_process_imports_loads_dynamo_or_sympy():
    installed = [p for p in PACKAGES if importlib.util.find_spec(p) is not None]
    assert "omni_core" in installed
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *installed], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _loaded(done) == "-", f"these modules import what they should not: {_loaded(done)}"


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
    assert "dynamo_at_import.eager(torch._dynamo)" in _loaded(done)


def test_building_each_demos_stages_loads_neither(short_tmp):
    """The demos' stages built and started in one interpreter: the first to load each is
    named (once loaded, the later ones cannot be told apart)."""
    demos = [str(REPO / "examples" / name) for name, pkg in DEMOS.items() if _installed(pkg)]
    if not demos:
        pytest.skip("none of the bundled model plugins is installed")
    done = subprocess.run(
        [sys.executable, "-c", BUILD_PROBE, *demos],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=short_tmp,
        env={**os.environ, "XDG_STATE_HOME": str(short_tmp)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _loaded(done) == "-", f"building these stages imported: {_loaded(done)}"


def test_a_model_built_empty_leaves_torchs_initialisers_as_they_were():
    """build_empty skips nn.init's initialisers only while it builds, a failed build too."""
    torch = pytest.importorskip("torch")
    from omni_qwen3_tts.weights import INITIALISERS, build_empty

    before = {name: getattr(torch.nn.init, name) for name in INITIALISERS}
    built = build_empty(lambda: torch.nn.Embedding(4, 3), torch.device("cpu"), torch.float32)
    assert built.weight.shape == (4, 3) and built.weight.device.type == "cpu"

    def failing() -> torch.nn.Module:
        raise RuntimeError("a factory that fails")

    with pytest.raises(RuntimeError, match="a factory that fails"):
        build_empty(failing, torch.device("cpu"), torch.float32)
    assert {name: getattr(torch.nn.init, name) for name in INITIALISERS} == before


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _loaded(done: subprocess.CompletedProcess[str]) -> str:
    """What a probe's ``LOADED`` line names, ``-`` for nothing."""
    line = next(x for x in done.stdout.splitlines() if x.startswith("LOADED "))
    return line.removeprefix("LOADED ")
