"""``omni_core``'s public names load on first access (PEP 562), not with the package.

Every submodule import runs the package ``__init__`` first, so an eager one
made ``import omni_core.errors`` pay for pydantic and every schema model.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import omni_core


def test_every_exported_name_resolves_and_is_listed() -> None:
    for name in omni_core.__all__:
        assert getattr(omni_core, name) is not None, name
    assert set(omni_core.__all__) <= set(dir(omni_core))


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        omni_core.NoSuchThing  # noqa: B018


def test_importing_the_package_imports_no_schema_or_plugin_machinery() -> None:
    code = (
        "import sys, omni_core.errors\n"
        "print(sorted(m for m in ('pydantic', 'pluggy', 'omni_core.schema') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
