"""Every Python snippet of README.md runs as written, against the demo it names.

A snippet is run when the line before its fence says which demo deploy file
serves it (``<!-- run by tests/test_readme_snippets.py against examples/X.toml -->``).
Each runs in a fresh interpreter, from a directory where ``examples/`` is the
repository's (the sample media it opens), with only the server's address
changed; it must exit 0 and print something.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKED = re.compile(
    r"<!-- run by tests/test_readme_snippets\.py against examples/(\S+)\.toml -->\n"
    r"```python\n(.*?)```",
    re.S,
)


def snippets() -> list[tuple[str, str]]:
    return MARKED.findall((ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_snippets_that_need_sample_media_are_all_marked_and_the_media_exist() -> None:
    found = snippets()
    assert len(found) == 5
    opened = {p for _, code in found for p in re.findall(r"examples/media/[\w.]+", code)}
    assert opened == {
        "examples/media/cat.png",
        "examples/media/hello.wav",
        "examples/media/my_voice.wav",
    }
    assert all((ROOT / path).stat().st_size > 0 for path in opened)
    for demo, _ in found:
        assert (ROOT / "examples" / f"{demo}.toml").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("demo", sorted({demo for demo, _ in snippets()}))
def test_each_readme_snippet_runs_against_its_demo(demo: str, tmp_path: Path) -> None:
    pytest.importorskip("openai")
    from omni_core.plugins import OmniPlugins
    from omni_core.testing import plan_on_cpu, short_private_dir

    (tmp_path / "examples").symlink_to(ROOT / "examples")
    with short_private_dir() as base:
        planned = plan_on_cpu(OmniPlugins(env={}), base, deploy=ROOT / "examples" / f"{demo}.toml")
        with planned.serve() as live:
            for code in (code for name, code in snippets() if name == demo):
                code = code.replace("http://127.0.0.1:8000", live.url)
                done = subprocess.run(
                    [sys.executable, "-c", code],
                    cwd=tmp_path,
                    capture_output=True,
                    text=True,
                    timeout=240,
                )
                assert done.returncode == 0, f"{code}\n--- stderr:\n{done.stderr[-3000:]}"
                assert done.stdout.strip() or list(tmp_path.glob("*.wav")), code
