"""A codec's memory beyond its weights: the formula against counted allocations, the
vocoder's bounded calls, and what the planner reserves for the stage.

The chunks are counted on the ``meta`` device (the code paths a GPU takes, no memory
used): a release-size decoder runs there in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from omni_core.kit.allocation_peak import AllocationPeak  # noqa: E402
from omni_qwen3_omni.code2wav.config import Code2WavConfig  # noqa: E402
from omni_qwen3_omni.code2wav.model import Code2Wav  # noqa: E402
from omni_qwen3_tts import memory  # noqa: E402
from omni_qwen3_tts.codec_footprint import (  # noqa: E402
    CHUNK_MEMORY,
    MAX_FRAME_ROWS,
    PROCESS_SLACK,
    decoder_footprint,
    stage_overhead,
)
from omni_qwen3_tts.config import DecoderConfig  # noqa: E402
from omni_qwen3_tts.speech_tokenizer.decoder import Decoder  # noqa: E402
from omni_qwen3_tts.stages import Vocoder  # noqa: E402

RELEASE = DecoderConfig()
GEOMETRIES = {
    "release": (Decoder, RELEASE, torch.float32),
    "release-bf16": (Decoder, RELEASE, torch.bfloat16),
    "narrow-decoder": (Decoder, dataclasses.replace(RELEASE, decoder_dim=768), torch.float32),
    "rates-4-4-4-2": (
        Decoder,
        dataclasses.replace(RELEASE, upsample_rates=(4, 4, 4, 2)),
        torch.float32,
    ),
    "code2wav": (Code2Wav, Code2WavConfig(), torch.float32),
}


def _counted(decoder, cfg, rows: int, frames: int) -> tuple[int, int]:
    """(peak bytes of one chunk after a first one, one stream's state bytes)."""
    with torch.inference_mode():
        state = decoder.new_stream(rows)
        first = torch.zeros(rows, cfg.num_quantizers, 4, dtype=torch.long, device="meta")
        decoder.stream(first, state)
        codes = torch.zeros(rows, cfg.num_quantizers, frames, dtype=torch.long, device="meta")
        with AllocationPeak() as peak:
            decoder.stream(codes, state)
    held = [*state.keys, *state.values, *state.tails.values(), state.valid, state.position]
    return peak.bytes, sum(t.untyped_storage().nbytes() for t in held) // rows


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_the_formula_holds_what_a_chunk_allocates(name):
    cls, cfg, dtype = GEOMETRIES[name]
    with torch.device("meta"):
        decoder = cls(cfg).to(dtype)
    footprint = decoder.footprint()
    for rows, frames in ((1, 4), (1, 48), (4, 48), (16, 4)):
        counted, state = _counted(decoder, cfg, rows, frames)
        assert footprint.state_bytes == state
        estimated = footprint.chunk_bytes(rows, frames)
        # never under what is allocated (a rounding's worth aside), and not far over
        assert 0.99 * counted <= estimated <= 1.15 * counted, (rows, frames, counted, estimated)


def test_a_large_batch_is_decoded_in_calls_within_the_budget(tiny_model):
    decoder = tiny_model.speech_tokenizer.decoder
    whole = Vocoder(decoder, 4, None, max_batch_size=8, cuda_graph=False)
    split = Vocoder(decoder, 4, None, max_batch_size=8, cuda_graph=False)
    footprint = split.footprint
    assert footprint is not None
    split.chunk_memory = footprint.chunk_bytes(3, 6)  # 3 rows of 6 frames a call
    assert split._calls(8, 6) == [(0, 3), (3, 6), (6, 8)]  # as few calls, as even as can be
    assert whole._calls(8, 6) == [(0, 8)]
    codes = torch.randint(0, 64, (8, 16, 6), generator=torch.Generator().manual_seed(5))
    audio = {}
    for name, vocoder in (("whole", whole), ("split", split)):
        streams = [decoder.new_stream() for _ in range(8)]
        vocoder.decode_streams(codes[:, :, :2], streams)  # a first chunk: the state is real
        with AllocationPeak() as peak:
            audio[name] = vocoder.decode_streams(codes[:, :, 2:], streams)
        audio[name + " peak"] = peak.bytes
    for a, b in zip(audio["whole"], audio["split"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert audio["split peak"] < audio["whole peak"]


def test_re_decoded_context_chunks_are_split_the_same_way(tiny_model):
    decoder = tiny_model.speech_tokenizer.decoder
    whole = Vocoder(decoder, 4, 3, max_batch_size=6, cuda_graph=False)
    split = Vocoder(decoder, 4, 3, max_batch_size=6, cuda_graph=False)
    split.chunk_memory = split.footprint.chunk_bytes(2, 7)  # 2 rows of 3 + 4 frames a call
    assert split._calls(6, 7) == [(0, 2), (2, 4), (4, 6)]
    codes = torch.randint(0, 64, (6, 16, 7), generator=torch.Generator().manual_seed(6))
    np.testing.assert_allclose(
        split.decode_with_context(codes, [3] * 6),
        whole.decode_with_context(codes, [3] * 6),
        rtol=1e-5,
        atol=1e-6,
    )


def _factory(**fields):
    defaults = dict(
        chunk_frames=4,
        max_chunk_frames=48,
        max_batch_size=None,
        left_context_frames=None,
        disable_cuda_graph=False,
    )
    return SimpleNamespace(**{**defaults, **fields})


def test_the_stage_reserves_its_chunks_streams_and_graphs():
    footprint = decoder_footprint(RELEASE, RELEASE.latent_dim, 2 * RELEASE.codebook_dim, 4)
    total, note = stage_overhead(_factory(), footprint)
    per_call = CHUNK_MEMORY // footprint.chunk_bytes(1, 48)  # 5 rows of 48 frames
    chunks = footprint.chunk_bytes(per_call, 48)
    assert chunks <= CHUNK_MEMORY < footprint.chunk_bytes(16, 48)
    # 15 graphs of at most MAX_FRAME_ROWS frames across their rows, 1 x 4-48 to 16 x 4
    shapes = [(1, f) for f in (4, 8, 16, 32, 48)] + [(2, f) for f in (4, 8, 16, 32)]
    shapes += [(4, 4), (4, 8), (4, 16), (8, 4), (8, 8), (16, 4)]
    assert all(r * f <= MAX_FRAME_ROWS for r, f in shapes)
    graphs = footprint.graph_bytes(shapes)
    assert total == PROCESS_SLACK + chunks + 16 * footprint.state_bytes + graphs
    assert "in calls of 5" in note and "16 streams" in note and "CUDA graphs" in note

    without_graphs, note = stage_overhead(_factory(disable_cuda_graph=True), footprint)
    assert total - without_graphs == graphs and "CUDA graphs" not in note
    small, _ = stage_overhead(_factory(max_batch_size=1, max_chunk_frames=12), footprint)
    assert small < without_graphs
    # re-decoded context: no state kept, no graphs, each call decodes context + chunk
    context, note = stage_overhead(_factory(left_context_frames=25), footprint)
    assert context == PROCESS_SLACK + footprint.calls_peak(16, 25 + 48)
    assert "25 + 48 frames" in note
    # a stage that decodes a batch in one call and captures nothing
    whole, note = stage_overhead(_factory(), footprint, chunk_memory=None, captured=False)
    assert whole == PROCESS_SLACK + footprint.chunk_bytes(16, 48) + 16 * footprint.state_bytes
    assert "in calls of 16" in note


def test_the_planner_reads_the_checkpoint_codec_and_dtype():
    stage = SimpleNamespace(factory=SimpleNamespace(**vars(_factory()), dtype="auto"))
    release = memory.vocoder(stage, memory.codec_decoder_config("Qwen/Qwen3-TTS-12Hz-0.6B-Base"))
    tiny = memory.vocoder(stage, memory.codec_decoder_config("tiny"))
    assert tiny.overhead_bytes - PROCESS_SLACK < (release.overhead_bytes - PROCESS_SLACK) / 10
    stage.factory.dtype = "bfloat16"
    half = memory.vocoder(stage, memory.codec_decoder_config("Qwen/Qwen3-TTS-12Hz-0.6B-Base"))
    # half the bytes a stream and a graph keep; calls of twice the rows within the budget
    assert half.weights_bytes * 2 == release.weights_bytes
    assert "calls of 5" in release.source and "calls of 11" in half.source
    assert half.overhead_bytes < release.overhead_bytes and "bfloat16" in half.source


def test_the_vocoder_estimate_counts_the_checkpoints_codec():
    """A local or preset checkpoint's tokenizer weights are counted from its config
    (``codec_params.py``); a hub id's are the release's."""
    from omni_qwen3_tts.codec_params import speech_decoder_params, speech_encoder_params

    stage = SimpleNamespace(factory=_factory(dtype="auto"))
    tiny = memory.codec_estimate(stage, "tiny")
    hub = memory.codec_estimate(stage, "Qwen/Qwen3-TTS-12Hz-0.6B-Base")
    assert hub.weights_bytes == 4 * memory.SPEECH_TOKENIZER_PARAMS  # the release, float32
    cfg = memory.codec_config("tiny")
    assert cfg is not None
    expected = speech_decoder_params(cfg.decoder) + speech_encoder_params(cfg.encoder)
    assert tiny.weights_bytes == 4 * expected < hub.weights_bytes / 100
