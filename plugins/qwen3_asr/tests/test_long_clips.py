"""Long clips cut at quiet points, pieces' answers merged, runaway repetitions collapsed.

Pure functions (:mod:`omni_qwen3_asr.split`, ``.merge``, ``.repetitions``)
on synthetic signals and strings, the preprocessing stage's pieces, and the
align stage's final text. The pipeline end to end is in ``test_serve.py``
(a clip longer than the piece length, streamed and not); the release's own
functions on the same inputs in ``test_reference.py`` (opt-in).
"""

from __future__ import annotations

import base64
import io
import itertools
import sys

import numpy as np
import pytest

from omni_qwen3_asr.merge import merge_languages, shifted
from omni_qwen3_asr.repetitions import collapse_repetitions
from omni_qwen3_asr.split import (
    MAX_ALIGNED_PIECE_SECONDS,
    MAX_PIECE_SECONDS,
    cut_points,
    split_clip,
)

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

RATE = 16_000


def _noise(seconds: float, seed: int = 0, level: float = 0.3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.uniform(-level, level, int(seconds * RATE))).astype(np.float32)


def _quiet(clip: np.ndarray, at: float, seconds: float, level: float) -> None:
    """Make ``seconds`` of ``clip`` from ``at`` quiet: every sample of magnitude ``level``."""
    start, stop = int(at * RATE), int((at + seconds) * RATE)
    clip[start:stop] = level * np.where(np.arange(stop - start) % 2, 1.0, -1.0)


def _joined(pieces) -> np.ndarray:
    return np.concatenate([p.samples[: p.length] for p in pieces])


def test_the_defaults_are_the_releases_piece_lengths() -> None:
    from omni_qwen3_asr.pipeline import PreprocessingArgs

    assert (MAX_PIECE_SECONDS, MAX_ALIGNED_PIECE_SECONDS) == (1200.0, 180.0)
    args = PreprocessingArgs()
    assert (args.max_piece_seconds, args.max_aligned_piece_seconds) == (1200.0, 180.0)


def test_a_clip_no_longer_than_a_piece_is_one_untouched_piece() -> None:
    clip = _noise(10.0)
    (piece,) = split_clip(clip, RATE, 10.0)
    assert piece.samples is clip and (piece.start, piece.length, piece.offset) == (0, len(clip), 0)
    short = _noise(0.2)  # short, but alone: not padded (the release pads only pieces)
    assert split_clip(short, RATE, 10.0)[0].samples.shape == short.shape


def test_each_cut_is_the_quietest_sample_of_the_quietest_window_near_its_nominal_point() -> None:
    clip = _noise(25.0)
    _quiet(clip, 9.0, 0.3, 0.02)  # quiet, but not the quietest within 5 s of 10 s
    _quiet(clip, 12.3, 0.2, 0.002)  # the quietest window within 5 s of 10 s
    quietest = int(12.37 * RATE)
    clip[quietest] = 0.0  # its quietest sample
    clip[int(16.0 * RATE) : int(16.5 * RATE)] = 0.0  # quieter still, but 6 s from 10 s
    _quiet(clip, 23.5, 0.2, 0.001)  # the next nominal cut is at 22.37 s: 23.5 is in reach
    second = int(23.61 * RATE)
    clip[second] = 0.0
    assert cut_points(clip, RATE, 10.0) == [quietest, second]


def test_ties_go_to_the_first_quiet_point_and_a_cut_never_stands_still() -> None:
    silence = np.zeros(25 * RATE, np.float32)
    # every window is as quiet as any: the first one in reach, 5 s before each nominal cut
    assert cut_points(silence, RATE, 10.0) == [5 * RATE, 10 * RATE, 15 * RATE]
    # a piece length under the 5 s reach: the search starts at the previous cut, where a
    # silent clip is cut one sample on (the release's rule; its lengths are far longer)
    assert cut_points(np.zeros(1500, np.float32), 1000, 1.0) == list(range(1, 501))


def test_the_pieces_rebuild_the_clip_exactly_and_say_where_they_start() -> None:
    clip = _noise(47.3, seed=4)
    for at in (8.2, 19.9, 31.0, 41.7):
        _quiet(clip, at, 0.15, 0.001)
    pieces = split_clip(clip, RATE, 10.0)
    assert len(pieces) >= 4
    assert np.array_equal(_joined(pieces), clip)
    starts = [p.start for p in pieces]
    assert starts == [0, *cut_points(clip, RATE, 10.0)]
    assert all(p.start + p.length == q.start for p, q in itertools.pairwise(pieces))
    assert [p.offset for p in pieces] == [s / RATE for s in starts]
    assert all(p.length <= 15 * RATE for p in pieces)  # a piece length and the 5 s reach


def test_a_piece_shorter_than_half_a_second_is_padded_with_silence() -> None:
    clip = _noise(10.3, seed=2)
    _quiet(clip, 10.1, 0.12, 0.0)  # silent from 10.1 s: the cut lands there
    head, tail = split_clip(clip, RATE, 10.0)
    assert tail.start == int(10.1 * RATE) and tail.offset == pytest.approx(10.1)
    assert tail.length == len(clip) - tail.start < RATE // 2
    assert tail.samples.shape == (RATE // 2,) and tail.samples.dtype == np.float32
    assert np.array_equal(tail.samples[: tail.length], clip[tail.start :])
    assert not tail.samples[tail.length :].any()
    assert np.array_equal(_joined([head, tail]), clip)


def test_languages_merge_in_order_without_repeats_or_blanks() -> None:
    assert merge_languages(["Chinese", "English", "English", "", None, "Chinese"]) == (
        "Chinese,English,Chinese"
    )
    assert merge_languages(["German"]) == "German"
    assert merge_languages([None, " "]) is None and merge_languages([]) is None


def test_words_shift_by_their_pieces_offset() -> None:
    from omni_qwen3_asr.aligner import WordTime

    words = [WordTime("hi", 0.1, 0.4), WordTime("there", 0.5, 0.901)]
    assert shifted(words, 180.0004) == [  # rounded to the millisecond, as the aligner's
        {"word": "hi", "start": 180.1, "end": 180.4},
        {"word": "there", "start": 180.5, "end": 180.901},
    ]


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("", ""),
        ("hello world", "hello world"),
        ("wow" + "!" * 50, "wow!"),  # a character more than 20 times: once
        ("好" * 21 + "的", "好的"),
        ("好" * 20 + "的", "好" * 20 + "的"),  # exactly 20, in a short text: kept
        ("ha" * 25, "ha"),  # a pattern 20 times or more: once
        ("I said " + "no way " * 22 + "ok", "I said no way ok"),
        ("你好" * 30 + "再见了" * 21 + "。", "你好再见了。"),
        ("abc " * 19, "abc " * 19),  # 19 times: kept
        ("hello " + "a" * 20, "hello " + "a" * 20),  # too near the end to be tried
        ("x" + "ab" * 20 + "y" * 40 + "z", "xaby" + "z"),
    ],
)
def test_runaway_repetitions_collapse_by_the_releases_rule(raw: str, clean: str) -> None:
    assert collapse_repetitions(raw) == clean


class _Request:
    def __init__(self, data):
        self.data = data


def _wav(samples: np.ndarray) -> str:
    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, samples, RATE, format="WAV", subtype="FLOAT")
    return base64.b64encode(buffer.getvalue()).decode()


def test_preprocessing_sends_pieces_for_a_long_clip_and_the_old_shape_for_a_short_one() -> None:
    import anyio

    from omni_qwen3_asr.preprocessing import create_preprocessing

    stage = create_preprocessing("tiny", max_piece_seconds=12.0, max_aligned_piece_seconds=7.0)
    clip = _noise(20.0, seed=7)
    _quiet(clip, 4.0, 0.2, 0.002)
    _quiet(clip, 9.5, 0.2, 0.001)
    _quiet(clip, 15.0, 0.2, 0.001)

    def prepared(samples: np.ndarray, **asked) -> dict:
        audio = {"type": "input_audio", "input_audio": {"data": _wav(samples)}}
        data = {
            "messages": [{"role": "user", "content": [audio]}],
            "transcription": {"task": "transcribe", "language": "en", **asked},
        }
        return anyio.run(stage.run, _Request(data))

    short = prepared(clip[: 12 * RATE])
    assert "pieces" not in short and short["token_ids"] and short["mel"].shape[0] == 128
    plain = prepared(clip)
    timed = prepared(clip, timestamps=["word"])  # the aligner's shorter pieces
    for got, seconds in ((plain, 12.0), (timed, 7.0)):
        expected = split_clip(clip, RATE, seconds)
        assert "token_ids" not in got and len(got["pieces"]) == len(expected) > 1
        assert [p["offset"] for p in got["pieces"]] == [p.offset for p in expected]
        for piece, cut in zip(got["pieces"], expected, strict=True):
            frames = piece["mel"].shape[-1]  # 100 per second
            assert abs(frames - cut.samples.shape[0] / 160) <= 1
            # the same context and forced language in every piece's prompt
            assert piece["token_ids"][-8:] == got["pieces"][0]["token_ids"][-8:]
    assert [len(plain["pieces"]), len(timed["pieces"])] == [2, 3]
    assert timed["words"] is True and plain["words"] is False


class _Streamed:
    def __init__(self, items: list):
        self.items, self.emitted = items, []

    @property
    async def stream(self):
        for item in self.items:
            yield item

    async def emit(self, item) -> None:
        self.emitted.append(item)


def test_the_final_text_is_each_pieces_text_cleaned_and_joined_the_deltas_stay_raw() -> None:
    import anyio

    from omni_qwen3_asr.stages import create_align

    stage = create_align("tiny")
    loop, rest = "ha" * 25, " and then"
    pieces = [
        {"text": "so " + loop, "language": "English", "align": None, "offset": 0.0},
        {"text": rest, "language": "English", "align": None, "offset": 20.0},
    ]
    trailer = {"finish_reason": "stop", "usage": None, "language": "English", "pieces": pieces}
    streamed = _Streamed(["so ", loop, rest, trailer])
    out = anyio.run(stage.run, streamed)
    assert streamed.emitted == ["so ", loop, rest]  # live, as the model wrote them
    assert out["text"] == out["transcript"] == "so ha and then"
    # pieces are cleaned one by one: a run split across two pieces is two short runs
    halves = [{**pieces[0], "text": "ha" * 15}, {**pieces[1], "text": "ha" * 15}]
    joined = anyio.run(stage.run, _Streamed([{**trailer, "pieces": halves}]))
    assert joined["text"] == "ha" * 30


def test_one_pieces_refusal_is_the_requests_refusal() -> None:
    """The asr stage runs a request's pieces in a task group; a RequestError in any of them
    (a prompt the engine can never admit) reaches the client as itself, not as a group."""
    from omni_core import RequestError
    from omni_qwen3_asr.stages import _first_request_error

    refusal = RequestError("the prompt takes 9000 positions")
    nested = BaseExceptionGroup("pieces", [ValueError("a"), BaseExceptionGroup("b", [refusal])])
    assert _first_request_error(nested) is refusal
    assert _first_request_error(BaseExceptionGroup("c", [ValueError("d")])) is None
