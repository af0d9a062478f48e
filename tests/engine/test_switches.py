"""The compiled steps' environment switches: on unless 0, and a clear error otherwise."""

from __future__ import annotations

import pytest

from omni_core.engine.switches import switch_on


@pytest.mark.parametrize(
    ("value", "on"),
    [(None, True), ("1", True), ("ON", True), (" true ", True), ("0", False), ("off", False)],
)
def test_a_switch_is_on_unless_it_says_0(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("OMNI_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("OMNI_TEST_SWITCH", value)
    assert switch_on("OMNI_TEST_SWITCH", "the thing") is on


def test_any_other_value_names_the_switch_and_what_it_takes(monkeypatch):
    monkeypatch.setenv("OMNI_TEST_SWITCH", "maybe")
    with pytest.raises(
        ValueError, match=r"OMNI_TEST_SWITCH='maybe': expected 1 \(the thing\) or 0"
    ):
        switch_on("OMNI_TEST_SWITCH", "the thing")
