"""Token selection on CUDA: nothing in a pick, or in a code predictor frame, waits for the GPU.

Marked ``cuda`` (run by ``benchmarks/gpu_check.py``). ``torch.cuda.set_sync_debug_mode``
("error") makes every synchronising call raise: a ``.item()``, a copy to the host, a
copy from pageable host memory. The first GPU check measured Qwen3-TTS at 28 ms a
frame at c=1 on an H200, most of it such waits, one per row at each of a frame's
16 picks. The same picks are also compared with the CPU's: greedy rows must agree,
and a seeded row must pick the same alone or beside others.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("OMNI_CUDA_DEVICE", "cuda")


@contextlib.contextmanager
def no_waits() -> Iterator[None]:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_the_talkers_picks_never_wait_and_keep_their_rows_apart() -> None:
    from omni_core.engine.sampling import make_generator
    from omni_qwen3_tts.sampling import RowSampling, select_tokens

    rows = [
        RowSampling(greedy=True, repetition_penalty=1.2),
        RowSampling(temperature=0.9, top_k=50, top_p=0.8, repetition_penalty=1.05),
        RowSampling(temperature=1.3),
    ]
    logits = torch.randn(3, 2048, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    histories = [torch.tensor([1, 2]), torch.tensor([7]), None]
    banned = [torch.tensor([3]), None, torch.tensor([4, 5])]
    select_tokens(logits, rows, [None] * 3, histories, banned)  # settings cached, pool warm
    gens = [make_generator(5 + b, DEVICE) for b in range(3)]
    with no_waits():
        together = select_tokens(logits, rows, gens, histories, banned)
    alone_gens = [make_generator(5 + b, DEVICE) for b in range(3)]
    alone = [
        int(
            select_tokens(
                logits[b : b + 1], [rows[b]], [alone_gens[b]], [histories[b]], [banned[b]]
            )
        )
        for b in range(3)
    ]
    assert together.tolist() == alone
    cpu = select_tokens(logits[:1].cpu(), rows[:1], [None], histories[:1], banned[:1])
    assert int(together[0]) == int(cpu)  # greedy: the CPU's argmax


def test_the_engines_sampler_never_waits() -> None:
    from omni_core.engine.interface import SamplingParams
    from omni_core.engine.sampling import make_generator, sample

    params = [
        SamplingParams(temperature=0, repetition_penalty=1.2),
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1, seed=2),
    ]
    logits = torch.randn(3, 151936, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    previous = [[1, 2], [], [3, 4]]
    gens = [make_generator(p.seed, DEVICE) for p in params]
    sample(logits, params, gens, previous)
    with no_waits():
        out = sample(logits, params, gens, previous)
    assert out.device.type == "cuda" and int(out.min()) >= 0 and int(out.max()) < 151936


def test_a_code_predictor_frame_never_waits() -> None:
    from omni_core.engine.sampling import make_generator
    from omni_qwen3_tts.model import Qwen3TTSModel
    from omni_qwen3_tts.sampling import RowSampling

    model = Qwen3TTSModel.from_pretrained(
        "tiny", load_format="dummy", seed=0, dtype="bfloat16", device=DEVICE
    )
    predictor = model.talker.code_predictor
    width = model.config.talker.transformer.hidden_size
    rows = [RowSampling(temperature=0.9, top_k=50, top_p=0.8), RowSampling(greedy=True)]
    x = torch.randn(2, width, dtype=torch.bfloat16, device=DEVICE)
    with torch.no_grad():
        predictor.generate_frame(x, x, rows, [None, None])  # kernels chosen, caches warm
        gens = [make_generator(3, DEVICE), None]
        with no_waits():
            codes = predictor.generate_frame(x, x, rows, gens)
    assert codes.shape == (2, model.config.talker.transformer.num_code_groups - 1)
