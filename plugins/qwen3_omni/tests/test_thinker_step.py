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


async def _answers(model, prompts, static=None):
    """Each prompt's tokens (and a spoken one's rows) through the engine, all at once."""
    import anyio

    from omni_core.engine.torch_engine import TorchEngine

    settings = EngineSettings(max_running_requests=4, max_total_tokens=512)
    out = {}
    async with TorchEngine(model, settings, static=static) as engine:

        async def one(name, prompt):
            sampling = SamplingParams(0.0, max_new_tokens=6)
            out[name] = [t async for t in engine.enqueue(name, prompt, sampling)]

        async with anyio.create_task_group() as group:
            for name, prompt in prompts.items():
                group.start_soon(one, name, prompt)
    return out


async def test_static_shape_decode_steps_equal_eager():
    """Plain and spoken requests together (3 rows in the 4-bucket): eager's tokens and rows."""
    from omni_core.engine.buckets import StaticPlan

    lm, config, _ = load_part("tiny", "thinker", "dummy", "float32", "cpu")
    accept = config.text.num_hidden_layers - 1
    prompts = {
        "a": EmbeddedPrompt([872, 198, 9707, 11, 1879, 0, 3, 4]),
        "b": EmbeddedPrompt([872, 198, 77, 5]),
        "spoken": EmbeddedPrompt([872, 198, 9707, 11, 12, 13]),
    }

    def step_model():
        model = ThinkerStepModel(
            lm, config.text, eos_ids=set(), device=torch.device("cpu"), dtype=torch.float32
        )
        model.capture("spoken", accept)
        model.expected_captures = (accept,)
        return model

    eager = await _answers(step_model(), prompts)
    model = step_model()
    static = await _answers(model, prompts, StaticPlan(False, False, (1, 4), "test"))
    assert static["a"] == eager["a"] and static["b"] == eager["b"]
    assert [o["token"] for o in static["spoken"]] == [o["token"] for o in eager["spoken"]]
    for got, want in zip(static["spoken"], eager["spoken"], strict=True):
        for g, w in zip(got["rows"], want["rows"], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert set(model._static) == {None, frozenset({0, accept})}
    assert model._static[frozenset({0, accept})].calls > 0  # a batch with a spoken row
    plain = {k: v for k, v in prompts.items() if k != "spoken"}  # no captured rows: the other
    alone = await _answers(model, plain, StaticPlan(False, False, (1, 4), "test"))
    assert alone == {k: eager[k] for k in plain}
    assert model._static[None].calls > 0
