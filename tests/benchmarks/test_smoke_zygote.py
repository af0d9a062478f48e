"""The zygote the smoke runs fork from (``smoke_zygote.py``): a forked run must look to
its script like ``python SCRIPT ARGS`` in a fresh interpreter."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, sys
print(json.dumps({
    "name": __name__,
    "argv": sys.argv,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "pytest": "pytest" in sys.modules,
    "torch": "torch" in sys.modules,
}))
sys.stderr.write("said on stderr\\n")
if sys.argv[1:] == ["fail"]:
    raise RuntimeError("a script that fails")
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
"""


def test_a_forked_run_is_its_scripts_own_process(tmp_path, zygote_type):
    script = tmp_path / "scripts" / "probe.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path[1:])}
    env.pop("PYTEST_CURRENT_TEST", None)
    zygote = zygote_type(env, tmp_path)
    try:
        code, out, err = zygote.run([str(script), "3"])
        seen = json.loads(out)
        assert code == 3 and err == "said on stderr\n"
        assert seen["name"] == "__main__" and seen["argv"] == [str(script), "3"]
        assert seen["path0"] == str(script.parent) and seen["cwd"] == str(REPO)
        assert seen["torch"] and not seen["pytest"]  # forked after torch, before anything else
        code, out, err = zygote.run([str(script), "fail"])
        assert code == 1 and "RuntimeError: a script that fails" in err and "Traceback" in err
        assert zygote.run([str(script)])[0] == 0  # the zygote serves run after run
    finally:
        zygote.close()
    assert zygote.process is not None and zygote.process.returncode == 0
