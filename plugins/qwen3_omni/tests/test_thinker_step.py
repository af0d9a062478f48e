"""The thinker on the engine: captured talker rows equal one full forward pass."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.backends import create_engine  # noqa: E402
from omni_core.engine.interface import EngineSettings, SamplingParams  # noqa: E402
from omni_core.engine.prompt import EmbeddedPrompt  # noqa: E402
from omni_qwen3_omni.loading import load_part  # noqa: E402
from omni_qwen3_omni.thinker.step import ThinkerStepModel  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_rows_streamed_step_by_step_equal_a_full_forward_pass():
    lm, config, _ = load_part("tiny", "thinker", "dummy", "float32", "cpu")
    model = ThinkerStepModel(
        lm, config.text, eos_ids=set(), device=torch.device("cpu"), dtype=torch.float32
    )
    accept = config.text.num_hidden_layers - 1
    prompt = EmbeddedPrompt([872, 198, 9707, 11, 1879, 0, 3, 4])
    model.capture("spoken", accept)
    settings = EngineSettings(max_running_requests=2, max_total_tokens=256)
    tokens, layer0, hidden = [], [], []
    async with create_engine(model, settings, device="cpu") as engine:
        plain = [
            t async for t in engine.enqueue("plain", prompt, SamplingParams(0.0, max_new_tokens=5))
        ]
        async with engine.enqueue(
            "spoken", prompt, SamplingParams(0.0, max_new_tokens=5)
        ) as stream:
            async for out in stream:
                tokens.append(out["token"])
                layer0.append(out["rows"][0])
                hidden.append(out["rows"][1])
    assert tokens == plain  # capturing changes nothing about the answer
    assert [r.shape[0] for r in layer0] == [len(prompt), 1, 1, 1, 1]
    ids = torch.tensor([prompt.token_ids + tokens[:-1]])
    positions = torch.arange(ids.shape[1])[None, None].expand(3, 1, -1)
    with torch.no_grad():
        _, full = lm(lm.embed(ids), positions, capture_layers={0, accept})
    torch.testing.assert_close(torch.cat(layer0), full[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat(hidden), full[accept][0], rtol=1e-4, atol=1e-4)
