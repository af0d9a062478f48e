"""The root conftest's schedule: the longest modules first, each module in its own order."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _root_conftest(config: pytest.Config):
    found = [m for m in config.pluginmanager.get_plugins() if hasattr(m, "LONGEST_FIRST")]
    assert found, "the root conftest.py defines LONGEST_FIRST"
    return found[0]


def test_every_module_named_first_exists(pytestconfig):
    """A renamed or removed module would silently fall back to the end of the run."""
    missing = [m for m in _root_conftest(pytestconfig).LONGEST_FIRST if not (REPO / m).is_file()]
    assert missing == []


def test_this_runs_collected_order_puts_the_named_modules_first(request):
    conftest = _root_conftest(request.config)
    order = [item.nodeid.split("::", 1)[0] for item in request.session.items]
    ranks = [conftest._schedule_rank(item) for item in request.session.items]
    assert ranks == sorted(ranks)  # named modules first, in the list's order
    # each module's tests stay together and in their file's order
    seen: list[str] = []
    for module in order:
        if not seen or seen[-1] != module:
            assert module not in seen, f"{module} was split"
            seen.append(module)
