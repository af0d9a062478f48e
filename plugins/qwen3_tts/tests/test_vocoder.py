"""The vocoder stage on its own: chunk schedule, stateful vs re-decoded context, batching.

The stage is driven directly (a request object with a code stream and an
``emit``), without the runtime, so each test states exactly which frames
arrive when; what it must produce is a full decode of the same codes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.cuda_graphs import FixedAddressReplay  # noqa: E402
from omni_qwen3_tts.stages import Vocoder  # noqa: E402

pytestmark = pytest.mark.anyio
SAMPLES_PER_FRAME = 1920

#: Each stateful test runs eagerly and with the chunks captured as a GPU would capture
#: them (the CPU's stand-in for CUDA graphs): the same audio either way.
CAPTURES = pytest.mark.parametrize("capture", [None, FixedAddressReplay], ids=["eager", "captured"])


def _stateful(model: Any, capture: Any, **chunking: Any) -> Vocoder:
    """A stateful vocoder over ``model``'s decoder, its chunks captured where ``capture`` is."""
    return Vocoder(
        model.speech_tokenizer.decoder, left_context_frames=None, capture=capture, **chunking
    )


def _replayed(vocoder: Vocoder, capture: Any) -> None:
    """With graphs, some chunks went through them; without, none could."""
    if capture is None:
        assert vocoder.graphs is None
    else:
        assert vocoder.graphs is not None and vocoder.graphs.replays > 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Request:
    """What the stage reads (``stream``) and where its chunks go (``emit``)."""

    items: list[Any]
    chunks: list[np.ndarray] = field(default_factory=list)

    @property
    def stream(self):
        async def frames():
            for item in self.items:
                yield item
                await anyio.sleep(0)  # let concurrent requests interleave

        return frames()

    async def emit(self, audio: np.ndarray) -> None:
        self.chunks.append(audio)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks)


def frames(count: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (count, 16), generator=torch.Generator().manual_seed(seed))


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@CAPTURES
async def test_stateful_chunks_grow_and_equal_a_full_decode(tiny_model, capture):
    vocoder = _stateful(tiny_model, capture, chunk_frames=3, max_chunk_frames=8)
    codes = frames(30, seed=1)
    request = Request(list(codes.unbind(0)))
    summary = await vocoder.run(request)
    assert [c.shape[0] // SAMPLES_PER_FRAME for c in request.chunks] == [3, 6, 8, 8, 5]
    assert summary == {
        "frames": 30,
        "samples": 30 * SAMPLES_PER_FRAME,
        "sample_rate": 24000,
        "finish_reason": None,  # nothing upstream said why the codes ended
    }
    full = tiny_model.speech_tokenizer.decoder(codes.T[None])[0, 0].numpy()
    assert rel_l2(request.audio, full) < 1e-5
    _replayed(vocoder, capture)


@CAPTURES
async def test_an_in_context_reference_is_decoded_but_never_played(tiny_model, capture):
    vocoder = _stateful(tiny_model, capture, chunk_frames=4)
    reference, codes = frames(9, seed=2), frames(10, seed=3)
    request = Request([{"reference": reference}, *codes.unbind(0)])
    summary = await vocoder.run(request)
    assert summary["frames"] == 10 and request.audio.shape == (10 * SAMPLES_PER_FRAME,)
    joined = tiny_model.speech_tokenizer.decoder(torch.cat([reference, codes]).T[None])[0, 0]
    assert rel_l2(request.audio, joined[9 * SAMPLES_PER_FRAME :].numpy()) < 1e-5
    _replayed(vocoder, capture)


async def test_re_decoded_context_is_exact_only_with_the_whole_receptive_field(tiny_model):
    decoder = tiny_model.speech_tokenizer.decoder
    codes = frames(24, seed=4)
    full = decoder(codes.T[None])[0, 0].numpy()
    exact = Request(list(codes.unbind(0)))
    await Vocoder(tiny_model.speech_tokenizer.decoder, 4, decoder.exact_context_frames()).run(exact)
    assert rel_l2(exact.audio, full) < 1e-5
    rough = Request(list(codes.unbind(0)))
    await Vocoder(tiny_model.speech_tokenizer.decoder, 4, 1).run(rough)
    assert rough.audio.shape == full.shape
    assert rel_l2(rough.audio, full) > 1e-4


@CAPTURES
async def test_concurrent_streams_batched_together_equal_their_own_full_decodes(
    tiny_model, capture
):
    vocoder = _stateful(tiny_model, capture, chunk_frames=2, max_batch_size=8)
    codes = [frames(n, seed=10 + n) for n in (7, 12, 12, 16)]
    requests = [Request(list(c.unbind(0))) for c in codes]
    async with anyio.create_task_group() as group:
        for request in requests:
            group.start_soon(vocoder.run, request)
    assert vocoder.batcher.batches < vocoder.batcher.chunks  # some chunks did share a decode
    decoder = tiny_model.speech_tokenizer.decoder
    for request, c in zip(requests, codes, strict=True):
        assert rel_l2(request.audio, decoder(c.T[None])[0, 0].numpy()) < 1e-5
    _replayed(vocoder, capture)


def test_a_negative_left_context_is_refused(tiny_model):
    with pytest.raises(ValueError, match="left_context_frames must be >= 0 or none, got -1"):
        Vocoder(tiny_model.speech_tokenizer.decoder, 4, -1)


@CAPTURES
async def test_chunks_may_grow_faster_and_still_equal_a_full_decode(tiny_model, capture):
    """chunk_growth 4 (MOSS-TTS's vocoder): fewer, larger chunks, the same audio."""
    vocoder = _stateful(tiny_model, capture, chunk_frames=2, max_chunk_frames=16, chunk_growth=4)
    codes = frames(40, seed=5)
    request = Request(list(codes.unbind(0)))
    await vocoder.run(request)
    assert [c.shape[0] // SAMPLES_PER_FRAME for c in request.chunks] == [2, 8, 16, 14]
    full = tiny_model.speech_tokenizer.decoder(codes.T[None])[0, 0].numpy()
    assert rel_l2(request.audio, full) < 1e-5
    _replayed(vocoder, capture)
    with pytest.raises(ValueError, match="chunk_growth"):
        Vocoder(tiny_model.speech_tokenizer.decoder, 2, None, chunk_growth=0)
