"""Captured streamed chunks of the codec decoder (``speech_tokenizer/stream_graphs.py``).

A CUDA graph cannot exist here, so ``FixedAddressReplay``
(``omni_core.engine.cuda_graphs``) stands in for one: it records the function
and its input buffers, and every replay writes the results into the same
output tensors, overwriting the last replay's, as a graph does. What these
tests check is everything around the graph: the shapes captured, the state
copied in and out (a stream that kept a view of an output would hear
another batch's state), padding rows up to a bucket, rows that start beside
rows that continue, and the eager fallback. The ``cuda`` test
``tests/cuda/test_codec_graphs_on_cuda.py`` runs the same path with real
graphs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from omni_core.engine.cuda_graphs import FixedAddressReplay  # noqa: E402
from omni_qwen3_tts.speech_tokenizer.stream_graphs import (  # noqa: E402
    StreamGraphs,
    chunk_schedule,
    row_buckets,
)
from omni_qwen3_tts.speech_tokenizer.streaming import StreamState  # noqa: E402


class StaleReplay(FixedAddressReplay):
    """A broken capture: replays return what the capture computed, whatever the inputs."""

    def replay(self) -> Any:
        return self.output


def _codes(decoder: Any, frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (1, decoder.cfg.num_quantizers, frames)
    return torch.randint(0, decoder.cfg.codebook_size, shape, generator=gen)


@pytest.fixture(scope="module")
def decoder(tiny_model):
    return tiny_model.speech_tokenizer.decoder


@pytest.fixture(scope="module")
def graphs(decoder) -> StreamGraphs:
    return StreamGraphs(decoder, [1, 2, 4], [2, 4], FixedAddressReplay)


def test_the_schedule_and_buckets_are_the_vocoders_chunks():
    assert chunk_schedule(4, 2, 48) == [4, 8, 16, 32, 48]
    assert chunk_schedule(4, 1, 48) == [4]
    assert chunk_schedule(12, 2, 12) == [12]
    assert row_buckets(16) == [1, 2, 4, 8, 16]
    assert row_buckets(6) == [1, 2, 4, 6]
    assert row_buckets(1) == [1]


def test_every_bucket_and_length_is_captured_and_said(graphs):
    assert sorted(graphs.graphs) == [(1, 2), (1, 4), (2, 2), (2, 4), (4, 2), (4, 4)]
    assert "captured as 6 CUDA graphs (rows x frames: 1 x 2-4, 2 x 2-4, 4 x 2-4)" in graphs.note()
    assert graphs.bucket(3) == 4 and graphs.bucket(5) is None


def test_only_chunks_of_few_frames_across_their_rows_are_captured(decoder):
    """A graph keeps its activations' memory: wide and long chunks stay eager."""
    small = StreamGraphs(decoder, [1, 2, 4], [2, 4], FixedAddressReplay, max_frame_rows=4)
    assert sorted(small.graphs) == [(1, 2), (1, 4), (2, 2)]
    assert "(rows x frames: 1 x 2-4, 2 x 2)" in small.note()
    streams = [decoder.new_stream() for _ in range(2)]
    with torch.inference_mode():
        assert small.decode(torch.cat([_codes(decoder, 4, 1)] * 2), streams) is None
    with pytest.raises(ValueError, match="no chunk of rows"):
        StreamGraphs(decoder, [2], [4], FixedAddressReplay, max_frame_rows=4)


def test_captured_streams_equal_eager_streams_chunk_after_chunk(decoder, graphs):
    """Three streams, one starting after the others, batched in changing company
    (3 rows padded to 4, then 2, then 1): each hears the full decode of its codes."""
    codes = [_codes(decoder, 14, seed) for seed in (1, 2, 3)]
    streams = [decoder.new_stream() for _ in codes]
    heard: list[list[torch.Tensor]] = [[], [], []]
    played = [0, 0, 0]
    before = graphs.replays

    def chunk(rows: list[int], length: int) -> None:
        batch = torch.cat([codes[r][..., played[r] : played[r] + length] for r in rows])
        with torch.inference_mode():
            out = graphs.decode(batch, [streams[r] for r in rows])
        assert out is not None
        for r, audio in zip(rows, out, strict=True):
            heard[r].append(audio.clone())  # the graph's buffer: the next replay overwrites it
            played[r] += length

    chunk([0, 1], 2)  # two fresh streams
    chunk([0, 1, 2], 4)  # a third starts beside them: 3 rows in the bucket of 4
    chunk([2], 4)
    chunk([1, 0], 4)  # in another order
    chunk([2, 0], 4)
    chunk([1], 4)
    chunk([2], 2)
    assert graphs.replays - before == 7
    for r, stream in enumerate(streams):
        assert stream.batch == 1 and stream.fresh == [False]
        assert int(stream.position[0]) == played[r]
        full = decoder(codes[r][..., : played[r]])[0]
        torch.testing.assert_close(torch.cat(heard[r], -1), full, atol=1e-5, rtol=0)


def test_a_stream_goes_on_eagerly_where_no_graph_has_its_shape(decoder, graphs):
    """A last chunk of another length runs eagerly on the state the graphs left."""
    codes = _codes(decoder, 9, 7)
    stream = decoder.new_stream()
    with torch.inference_mode():
        first = graphs.decode(codes[..., :4], [stream])[0].clone()
        assert graphs.decode(codes[..., 4:], [stream]) is None  # 5 frames: not captured
        rest = decoder.stream(codes[..., 4:], stream)
    torch.testing.assert_close(
        torch.cat([first, rest[0]], -1), decoder(codes)[0], atol=1e-5, rtol=0
    )
    five = [decoder.new_stream() for _ in range(5)]
    with torch.inference_mode():
        assert graphs.decode(torch.cat([codes[..., :2]] * 5), five) is None  # above 4 rows


def test_a_captured_chunk_reads_nothing_from_the_device(decoder, graphs):
    """What a CUDA graph cannot capture (``.item()``, ``.tolist()``, a tensor's truth:
    a wait for the device) raises on fake tensors, which hold no data: the chunk's
    function runs through on them, for a fresh stream's state as for a later one's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.inference_mode():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake = [mode.from_tensor(t) for t in graphs.graphs[(2, 4)].inputs]
        with mode:
            wav, *state = graphs._chunk(*fake)
    assert wav.shape == (2, 1, 4 * decoder.total_upsample) and len(state) == len(fake) - 1


def test_a_capture_that_replays_stale_output_is_refused(decoder):
    with pytest.raises(RuntimeError, match=r"captured chunk of 1 row\(s\) x 2 frame\(s\) differs"):
        StreamGraphs(decoder, [1], [2], StaleReplay)


def test_the_vocoder_decodes_through_its_graphs_and_says_so(tiny_model):
    from omni_qwen3_tts.stages import Vocoder

    decoder = tiny_model.speech_tokenizer.decoder
    plain = Vocoder(decoder, 2, None, max_batch_size=2, max_chunk_frames=4)
    assert plain.graphs is None and plain.graph_note == ""  # the CPU: nothing captured
    vocoder = Vocoder(
        decoder, 2, None, max_batch_size=2, max_chunk_frames=4, capture=FixedAddressReplay
    )
    assert sorted(vocoder.graphs.graphs) == [(1, 2), (1, 4), (2, 2), (2, 4)]
    assert vocoder.graph_note.startswith("streamed chunks captured as 4 CUDA graphs")
    codes = torch.cat([_codes(decoder, 6, 11), _codes(decoder, 6, 12)])  # [2, K, 6]
    ours = [decoder.new_stream(), decoder.new_stream()]
    theirs = [decoder.new_stream(), decoder.new_stream()]
    heard, expected = [], []
    for start, stop in ((0, 2), (2, 6)):
        part = codes[..., start:stop].transpose(1, 2)  # the batcher's rows are [T, K]
        heard.append(vocoder.decode_streams(part.transpose(1, 2), ours))
        expected.append(plain.decode_streams(part.transpose(1, 2), theirs))
    assert vocoder.graphs.replays == 2
    for got, want in zip(heard, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape
            assert abs(a - b).max() < 1e-5


def test_a_vocoder_whose_capture_fails_decodes_eagerly_and_says_why(tiny_model):
    from omni_qwen3_tts.stages import Vocoder

    decoder = tiny_model.speech_tokenizer.decoder
    vocoder = Vocoder(decoder, 2, None, max_batch_size=1, max_chunk_frames=2, capture=StaleReplay)
    assert vocoder.graphs is None
    assert vocoder.graph_note.startswith("chunks not captured, decoded eagerly (RuntimeError: ")
    context = Vocoder(decoder, 2, 25, capture=FixedAddressReplay)
    assert context.graphs is None and "left_context_frames" in context.graph_note
    off = Vocoder(decoder, 2, None, cuda_graph=False, capture=FixedAddressReplay)
    assert off.graphs is None and off.graph_note == ""
    long = Vocoder(decoder, 65, None, capture=FixedAddressReplay)  # every chunk over the cap
    assert long.graphs is None
    assert long.graph_note.startswith("chunks not captured: no chunk of rows [1] x frames [65]")


def test_a_fresh_state_knows_its_rows_start_without_reading_the_device(decoder):
    state = decoder.new_stream(2)
    assert state.fresh == [True, True]
    with torch.inference_mode():
        decoder.stream(torch.cat([_codes(decoder, 2, 1)] * 2), state)
    assert state.fresh == [False, False]
    newcomer = decoder.new_stream()
    both = StreamState.stack([state.split([1, 1])[0], newcomer])
    assert both.fresh == [False, True]
    assert both.split([1, 1])[1].fresh == [True]


def test_disable_cuda_graph_is_a_factory_field_of_both_streaming_vocoders(capsys):
    from omni_qwen3_omni.pipeline import Code2WavArgs
    from omni_qwen3_tts.pipeline import Qwen3TTSPipeline
    from omni_qwen3_tts.stages import create_vocoder

    assert Qwen3TTSPipeline.vocoder_args().disable_cuda_graph is False
    assert Qwen3TTSPipeline.vocoder_args(disable_cuda_graph=True).disable_cuda_graph is True
    assert Code2WavArgs(disable_cuda_graph=True).disable_cuda_graph is True
    vocoder = create_vocoder("tiny", load_format="dummy", disable_cuda_graph=True)
    assert vocoder.graphs is None and vocoder.graph_note == ""
    on_cpu = create_vocoder("tiny", load_format="dummy")  # nothing to say: no line in its log
    assert on_cpu.graphs is None and "vocoder:" not in capsys.readouterr().out


def test_a_gpu_with_little_free_memory_captures_nothing_and_says_so():
    from omni_qwen3_tts.stages import CAPTURE_MIN_FREE, memory_refusal

    assert memory_refusal(CAPTURE_MIN_FREE, "cuda:0") == ""
    said = memory_refusal(CAPTURE_MIN_FREE // 4, "cuda:1")
    assert said == (
        "chunks not captured: 0.25 GiB free on cuda:1, under the 1.00 GiB their graphs and "
        "the eager chunks beside them may take (decoded eagerly)"
    )
    assert memory_refusal(3 << 30, "cuda:0", needed=2 << 30) == ""
    assert "under the 2.00 GiB" in memory_refusal(1 << 30, "cuda:0", needed=2 << 30)


def test_what_a_capture_needs_follows_the_codec_and_the_batch(tiny_model):
    from omni_qwen3_tts.codec_footprint import MAX_FRAME_ROWS, captured_shapes
    from omni_qwen3_tts.stages import CAPTURE_MIN_FREE, Vocoder

    decoder = tiny_model.speech_tokenizer.decoder
    vocoder = Vocoder(decoder, 4, None, max_batch_size=16, max_chunk_frames=48, cuda_graph=False)
    assert vocoder._capture_needs() == CAPTURE_MIN_FREE  # the tiny codec's graphs are small
    vocoder.footprint = dataclasses.replace(vocoder.footprint, frame_bytes=4 << 20)
    lengths = [4, 8, 16, 32, 48]
    graphs = vocoder.footprint.graph_bytes(
        captured_shapes([1, 2, 4, 8, 16], lengths, MAX_FRAME_ROWS)
    )
    eager = vocoder.footprint.calls_peak(16, 48)
    assert vocoder._capture_needs() == graphs + eager > CAPTURE_MIN_FREE
