"""Long prompts prefilled in chunks on CUDA: the thinker's answers equal one-step prefills.

Marked ``cuda`` (run by ``benchmarks/gpu_check.py``). Chunked prefill reads the
cache written by earlier chunks through the same slot-store path as a decode
step; this checks it on the device where users run omni, with an image's
deepstack rows cut by a chunk boundary (float32: greedy answers of a random
tiny model, compared across chunkings, must not hang on bf16 ties).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.cuda, pytest.mark.anyio]

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_thinker_in_chunks_on_cuda_answers_as_in_one_step() -> None:
    from omni_core.engine.backends import create_engine
    from omni_core.engine.interface import EngineSettings, SamplingParams
    from omni_core.engine.prompt import EmbeddedPrompt
    from omni_qwen3_omni.loading import load_part
    from omni_qwen3_omni.thinker.step import ThinkerStepModel

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    device = torch.device(DEVICE)
    lm, config, _ = load_part("tiny", "thinker", "dummy", "float32", str(device))
    model = ThinkerStepModel(lm, config.text, eos_ids=set(), device=device, dtype=torch.float32)
    hidden = config.text.hidden_size
    g = torch.Generator().manual_seed(0)
    ids = [872 + (i * 37) % 500 for i in range(60)]
    flat = torch.cat([torch.arange(20), torch.full((4,), 20), torch.arange(21, 57)])
    prompt = EmbeddedPrompt(
        ids,
        positions=torch.stack([flat, flat, flat]),
        next_position=int(flat[-1]) + 1,
        embeddings=torch.randn(4, hidden, generator=g),
        embedding_index=torch.arange(20, 24),
        layer_additions=[torch.randn(4, hidden, generator=g) * 0.1 for _ in range(2)],
        addition_index=torch.arange(20, 24),
    )

    async def answer(budget: int) -> list[int]:
        settings = EngineSettings(
            max_running_requests=2, max_total_tokens=512, max_prefill_tokens=budget
        )
        async with create_engine(model, settings, device=str(device)) as engine:
            sampling = SamplingParams(0.0, max_new_tokens=6)
            return [t async for t in engine.enqueue("r", prompt, sampling)]

    assert await answer(22) == await answer(4096)
