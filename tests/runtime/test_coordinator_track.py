"""A request whose submitter is cancelled mid-submit is not left registered for ever."""

from __future__ import annotations

import anyio
import pytest

from omni_core.runtime.coordinator import Coordinator
from omni_core.runtime.graph import StageGraph
from omni_qwen3_tts.pipeline import Qwen3TTSPipeline

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_submit_cancelled_while_sending_still_hands_back_its_handle() -> None:
    coordinator = Coordinator(StageGraph.of(Qwen3TTSPipeline()), {"pipeline": 1}, max_inflight=4)
    sent = []

    async def slow_send(envelope) -> None:  # a busy socket to the entry stage
        await anyio.sleep(0.2)
        sent.append(envelope)

    coordinator.send = slow_send
    handle = None
    with anyio.move_on_after(0.05):  # the client goes away mid-submit
        handle = await coordinator.track({"input": "hi"})
    # The send finished (shielded) and the caller got the handle, so it can abort it;
    # before, the cancellation left the request registered, holding an admission slot.
    assert handle is not None and len(sent) == 1
    coordinator.abort(handle, "the client went away")
    assert coordinator.inflight == 0
