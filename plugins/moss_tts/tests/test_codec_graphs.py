"""The MOSS codec's streamed chunks captured with full windows (``codec/graphs.py``).

A CUDA graph cannot exist here, so ``FixedAddressReplay``
(``omni_core.engine.cuda_graphs``) stands in for one: every replay runs the
recorded function on the same input buffers and writes into the same output
tensors, as a graph does. What these tests check is everything around the
graph: full windows padded for young streams, the one state tensor all
graphs share and write in place, streams copied in and out in changing
company, captured and eager chunks taking turns on one stream, and the
vocoder and the planner seeing it. ``tests/cuda/test_codec_graphs_on_cuda.py``
runs the same path with real graphs.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from wide_codec import wide_codec_config  # noqa: E402

from omni_core.engine.cuda_graphs import FixedAddressReplay  # noqa: E402
from omni_core.kit.allocation_peak import AllocationPeak  # noqa: E402
from omni_moss_tts.codec import (  # noqa: E402
    AudioTokenizer,
    CodecConfig,
    dummy_fill_codec,
    tiny_codec_config,
)
from omni_moss_tts.codec.streaming import window_views, window_width  # noqa: E402
from omni_moss_tts.codec_footprint import CAPTURED_ROWS  # noqa: E402

torch.set_num_threads(1)


class StaleReplay(FixedAddressReplay):
    """A broken capture: replays return what the capture computed, whatever the inputs."""

    def replay(self) -> Any:
        return self.output


@pytest.fixture(scope="module")
def codec() -> AudioTokenizer:
    tok = AudioTokenizer(CodecConfig.from_dict(tiny_codec_config(0.4))).eval()
    dummy_fill_codec(tok, 0)
    return tok


@pytest.fixture(scope="module")
def graphs(codec):
    return codec.stream_graphs([1, 2, 4], [2, 8], FixedAddressReplay)


def _codes(rows: int, frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1024, (rows, 32, frames), generator=gen)


def test_captured_streams_equal_the_one_pass_decode_chunk_after_chunk(codec, graphs):
    """Three streams, in changing company, well past every window (the tiny codec's
    last transformer holds 39 positions, 5 frames): chunks of the captured lengths go
    through the graphs, the others (5 and 3 frames) eagerly on the windows the graphs
    left, and one stream's first chunk is eager, so that its grown windows are copied
    behind padding when a graph first takes it."""
    codes = _codes(3, 48, 3)
    heard: list[list[torch.Tensor]] = [[], [], []]
    with torch.inference_mode():
        full = [codec.decode(codes[r].t()) for r in range(3)]
        streams = [codec.new_stream() for _ in range(3)]
        first = codec.stream_rows(codes[2:3, :, :3], streams[2])  # eager: 3 frames
        heard[2].append(first[0].reshape(-1).clone())
        played = [0, 0, 3]
        before = graphs.replays
        for rows, length in (
            ([0, 1], 2), ([0, 1, 2], 8), ([2, 0], 2), ([1], 5), ([0, 1, 2], 8),
            ([2], 3), ([1, 2, 0], 2), ([0, 1, 2], 8), ([2, 1], 8),
        ):  # fmt: skip
            batch = torch.cat([codes[r : r + 1, :, played[r] : played[r] + length] for r in rows])
            chosen = [streams[r] for r in rows]
            audio = graphs.decode(batch, chosen)
            if audio is None:  # no graph of this length: eagerly, as the vocoder does
                assert length in (3, 5)
                assert len(rows) == 1
                audio = codec.stream_rows(batch, chosen[0])
            for r, row in zip(rows, audio, strict=True):
                heard[r].append(row.float().reshape(-1).clone())  # the graph's own buffer
                played[r] += length
        assert graphs.replays - before == 7
    for r in range(3):
        got = torch.cat(heard[r])
        want = full[r][: got.numel()]
        assert got.numel() == played[r] * 1920
        assert float((got - want).abs().max()) < 1e-5


def test_buckets_up_to_the_captured_rows_share_one_state_tensor(codec):
    from omni_qwen3_tts.stages import Vocoder

    # the stage's default: batches of 16, graphs of at most CAPTURED_ROWS rows
    vocoder = Vocoder(
        codec, 2, None, 16, 48, 24000, chunk_growth=4, chunk_memory=None,
        capture=FixedAddressReplay, graph_max_rows=CAPTURED_ROWS,
    )  # fmt: skip
    graphs = vocoder.graphs
    assert max(r for r, _ in graphs.graphs) == CAPTURED_ROWS == 8
    assert sorted(graphs.graphs) == [
        (1, 2), (1, 8), (1, 32), (1, 48), (2, 2), (2, 8), (2, 32), (4, 2), (4, 8), (8, 2),
        (8, 8),
    ]  # fmt: skip
    assert graphs.bucket(8) == 8 and graphs.bucket(9) is None  # 9-16 rows: eagerly
    assert graphs.state.shape == (8, window_width(codec.window_shapes()))
    # a graph keeps its codes and positions, and its audio: no windows of its own
    for graph in graphs.graphs.values():
        assert [t.dtype for t in graph.inputs] == [torch.long, torch.long]
        assert isinstance(graph.output, torch.Tensor) and graph.output.dim() == 2
    note = graphs.note()
    assert note.startswith("streamed chunks captured as 11 CUDA graphs (rows x frames: ")
    assert "8 x 2-8; full windows of 8 rows shared" in note


def _rows_of(stream: Any, graphs: Any) -> int | None:
    """Which row of the shared windows ``stream``'s windows are, or None (its own copy)."""
    width = graphs.state.stride(0) * graphs.state.element_size()
    offset = stream.flat.data_ptr() - graphs.state.data_ptr()
    inside = 0 <= offset < graphs.state.shape[0] * width
    return offset // width if inside else None


def test_streams_in_the_same_company_are_not_copied_in_or_out(codec):
    """After a replay a stream's windows are its rows of the shared tensor (views, in the
    window layout); the same streams in the same order next time copy nothing; another
    company first gives them copies of their own, equal to what they held."""
    graphs = codec.stream_graphs([1, 2, 4], [2], FixedAddressReplay)
    first, second, third = (codec.new_stream() for _ in range(3))
    with torch.inference_mode():
        graphs.decode(_codes(2, 2, 7), [first, second])
        assert graphs.copied_in == 2
        assert (_rows_of(first, graphs), _rows_of(second, graphs)) == (0, 1)
        views = window_views(first.flat, codec.window_shapes())
        assert first.kv[0][0][0].data_ptr() == views[0][0][0].data_ptr()
        graphs.decode(_codes(2, 2, 8), [first, second])  # the same company: nothing copied
        assert graphs.copied_in == 2
        assert [int(s.position[0]) for s in (first, second)] == [4, 4]
        graphs.decode(_codes(2, 2, 9), [second, first])  # another order: copied again
        assert graphs.copied_in == 4
        assert (_rows_of(second, graphs), _rows_of(first, graphs)) == (0, 1)
        held = [first.flat.clone(), second.flat.clone()]
        graphs.decode(_codes(1, 2, 10), [third])  # another company takes row 0
        assert _rows_of(third, graphs) == 0 and graphs.copied_in == 5
        assert _rows_of(first, graphs) is None and _rows_of(second, graphs) is None
        assert torch.equal(first.flat, held[0]) and torch.equal(second.flat, held[1])
        assert first.kv[0][0][0].data_ptr() == first.flat.data_ptr()
        codec.stream_rows(_codes(1, 3, 11), third)  # an eager chunk: windows of its own
    assert third.flat is None and int(third.position[0]) == 5
    with torch.inference_mode():  # its old rows, though still its last replay's, are not
        graphs.decode(_codes(1, 2, 12), [third])
    assert graphs.copied_in == 6 and int(third.position[0]) == 7


def test_a_stream_whose_request_ended_is_not_copied_out(codec):
    import gc

    graphs = codec.stream_graphs([1, 2], [2], FixedAddressReplay)
    kept, ended = codec.new_stream(), codec.new_stream()
    with torch.inference_mode():
        graphs.decode(_codes(2, 2, 13), [kept, ended])
        del ended
        gc.collect()
        graphs.decode(_codes(1, 2, 14), [codec.new_stream()])
    assert graphs.copied_out == 1 and _rows_of(kept, graphs) is None


def test_a_captured_chunk_reads_nothing_from_the_device(codec, graphs):
    """What a CUDA graph cannot capture (``.item()``, ``.tolist()``, a tensor's truth:
    a wait for the device) raises on fake tensors, which hold no data."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.inference_mode():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake = [mode.from_tensor(t) for t in graphs.graphs[(4, 8)].inputs]
        with mode:
            wav = graphs._chunk(*fake)
    assert wav.shape == (4, 8 * 1920)


def test_a_capture_that_replays_stale_output_is_refused(codec):
    with pytest.raises(RuntimeError, match=r"captured chunk of 1 row\(s\) x 2 frame\(s\) differs"):
        codec.stream_graphs([1], [2], StaleReplay)


@pytest.mark.parametrize("raw", [tiny_codec_config(), wide_codec_config()], ids=["tiny", "wide"])
def test_the_captured_chunk_allocates_what_the_footprint_says(raw):
    """Counted on ``meta``: a captured chunk's activations (its windows written in place)
    within the footprint's pool per row, and the shared tensor a row's state."""
    with torch.device("meta"):
        meta = AudioTokenizer(CodecConfig.from_dict(raw))
    footprint = meta.footprint()
    shapes = meta.window_shapes()
    for rows, frames in ((1, 2), (4, 8), (8, 48)):
        flat = torch.zeros(rows, window_width(shapes), device="meta")
        codes = torch.zeros(rows, 32, frames, dtype=torch.long, device="meta")
        start = torch.zeros(rows, dtype=torch.long, device="meta")
        with torch.inference_mode(), AllocationPeak() as peak:
            meta.decode_window(codes, start, window_views(flat, shapes))
        estimated = rows * (footprint.row_bytes + frames * footprint.frame_bytes)
        assert peak.bytes <= estimated <= 4 * peak.bytes, (rows, frames, peak.bytes, estimated)
        assert flat.untyped_storage().nbytes() + 8 * rows == rows * footprint.state_bytes
    counted = footprint.graph_bytes([(1, 2), (8, 8), (16, 2)])  # 16 rows: not captured
    assert counted == (
        8 * (footprint.row_bytes + 8 * footprint.frame_bytes)
        + 8 * footprint.state_bytes
        + (1 * 2 + 8 * 8) * 1920 * footprint.itemsize
    )


def test_the_moss_vocoder_decodes_through_its_graphs_and_says_so(codec):
    from omni_qwen3_tts.stages import Vocoder

    def vocoder(**kwargs: Any) -> Vocoder:
        return Vocoder(codec, 2, None, 2, 8, 24000, chunk_growth=4, chunk_memory=None, **kwargs)

    plain = vocoder()
    assert plain.graphs is None and plain.graph_note == ""  # the CPU: nothing captured
    captured = vocoder(capture=FixedAddressReplay)
    assert sorted(captured.graphs.graphs) == [(1, 2), (1, 8), (2, 2), (2, 8)]
    assert captured.graph_note.startswith("streamed chunks captured as 4 CUDA graphs")
    off = vocoder(capture=FixedAddressReplay, cuda_graph=False)
    assert off.graphs is None and off.graph_note == ""
    stale = vocoder(capture=StaleReplay)
    assert stale.graphs is None
    assert stale.graph_note.startswith("chunks not captured, decoded eagerly (RuntimeError: ")
    codes = _codes(2, 15, 21)
    ours = [codec.new_stream(), codec.new_stream()]
    theirs = [codec.new_stream(), codec.new_stream()]
    # 3 frames: both streams eagerly together, between chunks of the graphs' same company
    for start, stop in ((0, 2), (2, 10), (10, 13), (13, 15)):
        got = captured.decode_streams(codes[..., start:stop], ours)
        want = plain.decode_streams(codes[..., start:stop], theirs)
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape and abs(a - b).max() < 1e-5
    assert captured.graphs.replays == 3


def test_the_plan_counts_the_graphs_unless_the_stage_turns_them_off():
    from omni_moss_tts.codec_footprint import RELEASE_DECODER, codec_footprint
    from omni_qwen3_tts.codec_footprint import stage_overhead

    footprint = codec_footprint(RELEASE_DECODER, 4)
    factory = SimpleNamespace(
        chunk_frames=2, max_chunk_frames=48, max_batch_size=None, left_context_frames=None,
        disable_cuda_graph=False,
    )  # fmt: skip
    on, note = stage_overhead(factory, footprint, growth=4, chunk_memory=None)
    factory.disable_cuda_graph = True
    off, plain = stage_overhead(factory, footprint, growth=4, chunk_memory=None)
    assert "CUDA graphs 1.4" in note and "CUDA graphs" not in plain
    # the release's float32 windows of 8 rows, the most a graph has: 1.35 GB
    assert on - off >= 8 * footprint.state_bytes > 1.3e9
    # factory.cuda_graph_max_bs = 16: windows 16 rows tall, counted as such
    taller, _ = stage_overhead(
        factory_on := SimpleNamespace(**{**vars(factory), "disable_cuda_graph": False}),
        codec_footprint(RELEASE_DECODER, 4, captured_rows=16),
        growth=4,
        chunk_memory=None,
    )
    assert factory_on.max_batch_size is None  # the stage's 16 a batch (GPU_BATCH)
    assert taller - on >= 8 * footprint.state_bytes


def test_the_vocoder_captures_up_to_its_largest_batch_and_says_what_it_counts(codec):
    """``factory.cuda_graph_max_bs``: the rows buckets the graphs take; the footprint the
    stage checks its free memory against counts windows that many rows tall."""
    from omni_qwen3_tts.stages import Vocoder

    def vocoder(most: int | None) -> Vocoder:
        return Vocoder(
            codec, 2, None, 16, 8, 24000, chunk_growth=4, chunk_memory=None,
            capture=FixedAddressReplay, graph_max_rows=most,
        )  # fmt: skip

    two, sixteen, every = vocoder(2), vocoder(16), vocoder(None)
    assert sorted({r for r, _ in two.graphs.graphs}) == [1, 2]
    assert two.graphs.bucket(2) == 2 and two.graphs.bucket(3) is None  # 3-16 rows: eagerly
    assert sorted({r for r, _ in sixteen.graphs.graphs}) == [1, 2, 4, 8, 16]
    assert sixteen.graphs.state.shape[0] == 16 and two.graphs.state.shape[0] == 2
    assert "full windows of 16 rows shared" in sixteen.graph_note
    assert sorted(every.graphs.graphs) == sorted(sixteen.graphs.graphs)  # None: the batch
    assert two.footprint.captured_rows == 2 and sixteen.footprint.captured_rows == 16
    # what _capture_needs sizes (above its 1 GiB floor, which a tiny codec stays under)
    shapes = [(rows, 2) for rows in (1, 2, 4, 8, 16)]
    more = sixteen.footprint.graph_bytes(shapes) - two.footprint.graph_bytes(shapes)
    assert more >= 14 * two.footprint.state_bytes
    with pytest.raises(ValueError, match="largest captured batch must be >= 1, got 0"):
        vocoder(0)


def test_the_stage_field_reaches_the_vocoder_and_is_checked(monkeypatch):
    from pydantic import ValidationError

    from omni_moss_tts import stages
    from omni_moss_tts.pipeline import VocoderArgs

    assert VocoderArgs().cuda_graph_max_bs == CAPTURED_ROWS
    assert VocoderArgs(cuda_graph_max_bs=16).cuda_graph_max_bs == 16
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        VocoderArgs(cuda_graph_max_bs=0)
    made = stages.create_vocoder("tiny", load_format="dummy", cuda_graph_max_bs=4)
    assert made.graph_max_rows == 4 and made.footprint.captured_rows == 4
    assert stages.create_vocoder("tiny", load_format="dummy").graph_max_rows == CAPTURED_ROWS
