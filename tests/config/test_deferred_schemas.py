"""Pydantic schemas are built when a model is first used, not when a plugin is imported.

Building every installed pipeline's validators at import was most of what
``omni plugins list`` did (``defer_build`` on the schema base classes; the
timings are in ``benchmarks/bench_cli.py``). The price is that a schema
pydantic cannot build now surfaces when the pipeline is resolved, so that
must still be a plugin error, not a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from omni_core import FactoryArgs, PipelineConfig, StageConfig, hookimpl
from omni_core.errors import PluginError

PROBE = textwrap.dedent(
    """
    import io, json, sys
    from contextlib import redirect_stdout
    from pydantic import BaseModel
    from omni_core.cli import main

    with redirect_stdout(io.StringIO()):
        code = main(sys.argv[1:])

    def models(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from models(sub)

    built = sorted({m.__qualname__ for m in models(BaseModel)
                    if m.__module__.startswith("omni_") and m.__pydantic_complete__})
    print(json.dumps({"code": code, "built": built}))
    """
)


def _built_after(*argv: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMNI_PLUGINS"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_listing_builds_no_schema() -> None:
    report = _built_after("plugins", "list", "--json")
    assert report == {"code": 0, "built": []}


def test_resolving_builds_only_the_resolved_pipelines_schemas() -> None:
    report = _built_after("config", "resolve", "--pipeline", "qwen3-tts")
    assert report["code"] == 0
    assert "Qwen3TTSPipeline" in report["built"]
    assert not [name for name in report["built"] if "Omni" in name or "Moss" in name]


class _Opaque:
    """A type pydantic has no schema for (no arbitrary_types_allowed)."""


def test_a_schema_pydantic_cannot_build_is_the_plugins_error(plugins, resolve) -> None:
    class OpaqueArgs(FactoryArgs):  # defined fine: the schema is only built on use
        handle: _Opaque | None = None

    class Pipe(PipelineConfig):
        pipeline_name = "opaque"
        entry_stage = "only"

        @classmethod
        def default_stages(cls):
            only = StageConfig(name="only", factory_path="m:f", terminal=True, process="p")
            return [only.model_copy(update={"factory": OpaqueArgs()})]

    class Plugin:
        @hookimpl
        def omni_register_pipelines(self):
            return [Pipe]

    with plugins.registered(Plugin(), "opaque-plugin"):
        assert plugins.pipeline("opaque") is Pipe
        with pytest.raises(PluginError) as info:
            resolve(None, pipeline="opaque")
    message = str(info.value)
    assert "pipeline 'opaque' of plugin 'opaque-plugin'" in message
    assert "_Opaque" in message
