"""A long clip cut into pieces the model transcribes one by one, each cut at a quiet point.

Why pieces: Qwen3-ASR was trained, and its release is run, on clips of at
most 20 minutes, and its forced aligner on clips of at most 3 minutes (the
aligner's classes cover a bounded span of time). The release
(``qwen_asr.inference``, 0.0.6) therefore cuts anything longer and
transcribes the pieces separately; we cut where it cuts, so a long clip gets
the same transcript here as there:

- a clip no longer than the piece length is one piece, untouched;
- otherwise a cut is due every piece length from the previous one; it moves
  to the quietest 100 ms window within 5 s either side of that nominal point
  (summed magnitude; the first such window on a tie), at that window's
  quietest sample (again the first on a tie), never before the previous cut
  plus one sample;
- the pieces cover the clip exactly (no gap, no overlap), and each one's
  ``offset`` is where it starts, in seconds, so word timings can be shifted
  back onto the whole clip;
- a piece shorter than 0.5 s is padded with silence at its end (the padding
  is not part of the clip: it lengthens no offset).

The piece length is a setting of the preprocessing stage
(``factory.max_piece_seconds``, ``factory.max_aligned_piece_seconds``); the
constants below are the release's values and the settings' defaults. numpy
is imported where it is used: the pipeline declaration reads the constants in
the parent, which imports no array library.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

MAX_PIECE_SECONDS = 1200.0  # the release's longest ASR input (MAX_ASR_INPUT_SECONDS)
MAX_ALIGNED_PIECE_SECONDS = 180.0  # its longest input to the forced aligner
MIN_PIECE_SECONDS = 0.5  # shorter pieces are padded with silence to this
SEARCH_SECONDS = 5.0  # a cut may move this far either side of its nominal point
WINDOW_SECONDS = 0.1  # the span whose summed magnitude measures quiet


@dataclass(frozen=True)
class Piece:
    """One piece of a clip: its samples (padded when short) and where it starts."""

    samples: np.ndarray  # float32, mono
    start: int  # first sample, in the clip
    length: int  # samples of the clip it covers (the padding excluded)
    offset: float  # start in seconds


def cut_points(
    samples: np.ndarray,
    rate: int,
    piece_seconds: float,
    search_seconds: float = SEARCH_SECONDS,
    window_seconds: float = WINDOW_SECONDS,
) -> list[int]:
    """Sample indexes where the clip is cut (increasing; neither 0 nor its length)."""
    total = int(samples.shape[0])
    if total / float(rate) <= piece_seconds:
        return []
    step = int(piece_seconds * rate)
    reach = int(search_seconds * rate)
    window = max(4, int(window_seconds * rate))
    cuts: list[int] = []
    start = 0
    while total - start > step:
        nominal = start + step
        low, high = max(start, nominal - reach), min(total, nominal + reach)
        cut = nominal if high - low <= window else low + _quietest(samples[low:high], window)
        cut = min(max(cut, start + 1), total)
        cuts.append(cut)
        start = cut
    return cuts


def _quietest(span: np.ndarray, window: int) -> int:
    """Index in ``span`` of the quietest sample inside its quietest ``window``-long stretch."""
    import numpy as np

    magnitude = np.abs(span.astype(np.float64))
    running = np.concatenate(([0.0], np.cumsum(magnitude)))
    energy = running[window:] - running[:-window]  # energy[i]: magnitude summed over i..i+window
    first = int(np.argmin(energy))
    return first + int(np.argmin(magnitude[first : first + window]))


def split_clip(
    samples: np.ndarray,
    rate: int,
    piece_seconds: float,
    min_seconds: float = MIN_PIECE_SECONDS,
) -> list[Piece]:
    """The clip's pieces, in order (one piece, the clip itself, when it is short enough)."""
    import numpy as np

    samples = np.asarray(samples, dtype=np.float32)
    cuts = cut_points(samples, rate, piece_seconds)
    if not cuts:
        return [Piece(samples, 0, int(samples.shape[0]), 0.0)]
    edges = [0, *cuts, int(samples.shape[0])]
    shortest = int(min_seconds * rate)
    pieces = []
    for start, end in itertools.pairwise(edges):
        part = samples[start:end]
        if part.shape[0] < shortest:
            part = np.concatenate([part, np.zeros(shortest - part.shape[0], np.float32)])
        pieces.append(Piece(part, start, end - start, start / float(rate)))
    return pieces
