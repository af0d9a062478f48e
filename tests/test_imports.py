"""The core never imports an ML framework: listing, resolving and planning stay light.

Checked in a fresh interpreter, because this test session may already have
imported anything. torch is installed here (the plugins depend on it), so only
the core's discipline keeps it out of ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from installed_plugins import ONLY_SHIPPED

HEAVY = ("torch", "numpy")
# The shipped plugins only: a developer's own plugin, installed here too, may import
# what it likes (and the shell's OMNI_PLUGINS must not narrow what is checked).
SHIPPED_ENV = {**os.environ, "OMNI_PLUGINS": ONLY_SHIPPED}

SCRIPT = textwrap.dedent(
    """
    import json, sys

    import omni_core
    import omni_core.testing  # plugin authors' test helpers stay light too
    from omni_core.cli import main
    from omni_core.plugins import get_plugins

    plugins = get_plugins()
    plugins.listing(include_builtin=True)
    built = {}
    for name in plugins.pipelines():
        config = plugins.pipeline(name)()
        built[name] = config.stage_names
    codes = {
        "plugins": main(["plugins", "list", "--json", "--all"]),
        "plan": main(["plan", "--pipeline", "qwen3-omni", "--no-detect", "--json"]),
        "plan_asr": main(["plan", "--pipeline", "qwen3-asr", "--no-detect", "--json"]),
        "config": main(["config", "resolve", "--pipeline", "qwen3-tts"]),
    }
    # the auto policy asks every plugin's memory estimates (codec footprints included)
    for name in ("qwen3-tts", "moss-tts", "qwen3-omni"):
        codes["auto_" + name] = main([
            "plan", "--pipeline", name, "--no-detect", "--json", "--gpus", "2",
            "--gpu-memory", "80GiB", "--placement.policy", "auto",
        ])
    print(json.dumps({
        "pipelines": built,
        "codes": codes,
        "heavy": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY),
    }))
    """
)


def test_listing_resolving_and_planning_import_no_ml_framework() -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{SCRIPT}"],
        env=SHIPPED_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # The script really did the work: every installed pipeline was looked up and built
    # (the walk-through's too, if examples/plugin is installed).
    assert set(report["pipelines"]) - {"hello"} == {
        "moss-tts",
        "qwen3-omni",
        "qwen3-omni-colocated",
        "qwen3-omni-text",
        "qwen3-asr",
        "qwen3-tts",
    }
    # ... and every command ran to completion.
    assert report["codes"] == {
        "plugins": 0,
        "plan": 0,
        "plan_asr": 0,
        "config": 0,
        "auto_qwen3-tts": 0,
        "auto_moss-tts": 0,
        "auto_qwen3-omni": 0,
    }
    assert report["heavy"] == []


def test_listing_loads_no_transport_or_planner_implementation() -> None:
    """Built-ins register lazily: the listing names them without importing them (nor Ray)."""
    code = (
        "import sys\n"
        "from omni_core.plugins import OmniPlugins\n"
        "plugins = OmniPlugins()\n"
        "rows = plugins.listing(include_builtin=True)\n"
        "names = {t for row in rows if row['builtin'] for t in row['transports']}\n"
        "assert names == {'inproc', 'shm', 'socket', 'tcp'}, names\n"
        "launchers = {t for row in rows if row['builtin'] for t in row['launchers']}\n"
        "assert launchers == {'local', 'ray'}, launchers\n"
        "heavy = [m for m in ('omni_core.runtime.transports.shm', 'omni_core.plan.planner',\n"
        "         'omni_core.runtime.runtime', 'omni_core.runtime.launchers.ray', 'ray',\n"
        "         'anyio') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "shm = plugins.transport('shm')\n"
        "assert shm.scopes == {'host'}\n"
        "shm.check_address('unix:/tmp/x.sock')\n"
        "assert 'omni_core.runtime.transports.shm' in sys.modules\n"
        "# what omni plan asks of a transport loads none of its stream machinery\n"
        "assert 'omni_core.runtime.transports._stream' not in sys.modules\n"
        "assert 'asyncio' not in sys.modules and 'anyio' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=SHIPPED_ENV, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_the_placement_contract_and_the_hook_specs_import_nothing_of_the_planner() -> None:
    """Dependencies run one way: the planner builds on the contract, never the reverse."""
    code = (
        "import sys, omni_core.placement, omni_core.hookspecs\n"
        "print(sorted(m for m in sys.modules if m.startswith('omni_core.plan')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_resolving_one_pipeline_imports_no_other_plugins_pipeline_module() -> None:
    """The model plugins register by name (LazyPipeline): only the pipeline used is imported."""
    pytest.importorskip("omni_qwen3_omni")
    pytest.importorskip("omni_moss_tts")
    code = (
        "import sys\n"
        "from omni_core.config import load_deployment\n"
        "load_deployment(None, [], pipeline='qwen3-tts')\n"
        "print(sorted(m for m in sys.modules if m.endswith('.pipeline')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=SHIPPED_ENV, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.strip()
    assert "omni_qwen3_tts.pipeline" in loaded
    assert "omni_qwen3_omni.pipeline" not in loaded and "omni_moss_tts.pipeline" not in loaded
