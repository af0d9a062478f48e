"""The engine's tests run on asyncio (the backend the runtime uses)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
