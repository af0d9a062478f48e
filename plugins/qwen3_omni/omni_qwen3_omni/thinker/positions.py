"""Three-stream rotary position ids (temporal, height, width) of one thinker prompt.

The thinker's rotary embedding takes three position streams. Text tokens get
the same position in all three, one more than the previous token. Media blocks
(the placeholder runs the processor expands) are laid out as follows, each
block starting at ``s``, the position the next text token would have had:

- image, grid ``(t, h, w)`` in patches: one token per ``merge x merge`` patch
  square, in (frame, row, column) order; token ``(f, r, c)`` gets
  ``(s + f * pps, s + r, s + c)`` where ``pps`` is ``position_id_per_seconds``
  and ``r < h/merge``, ``c < w/merge``;
- video: the same with frame ``f`` at ``s + f * second_per_grid * pps``, so
  the temporal stream counts time, ``pps`` positions per second;
- audio: ``s + i`` in all three streams for its ``i``-th token (13 tokens per
  second at the release's ``pps`` of 13: audio time and video time agree);
- audio inside a video (``<vision_start><audio_start>`` then interleaved video
  and audio placeholders): both laid out from the same ``s``, and the
  processor orders the tokens by time (a video token goes first when its
  temporal position is not after the audio token's).

After a media block the next text token (its end marker included) continues
at one past the largest position of the block. For audio inside a video the
release takes that maximum over the trailing run of the interleaving only
(the tokens left after one of the two streams ran out), not over the whole
block; we do the same, since these positions must match the ones the model
was trained with. Start markers are ordinary text tokens.

Generation continues from ``next_position`` (one past the largest position of
the prompt, across all streams), the same in all three streams, one per step.
``next_position - len(prompt)`` is what the release calls the rope delta.

Token counts, not mel frames, are what this module reads: every block's
length is taken from the prompt and checked against the grids (and against
``audio_lengths``, encoder output tokens, when given); :func:`audio_token_count`
converts a mel frame count as the release does. Positions are integers; a
video whose ``second_per_grid * pps`` gives fractional temporal positions (an
odd sampling rate) is refused with an error rather than rounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..audio.mel import audio_token_count  # noqa: F401 - re-exported for callers
from ..config import ThinkerConfig

Grid = tuple[int, int, int]


class PromptLayoutError(ValueError):
    """A prompt whose media placeholders do not match the media it comes with."""


@dataclass(frozen=True)
class MediaTokens:
    """The token ids and constants the position rules read (from the thinker config)."""

    audio: int
    image: int
    video: int
    audio_start: int
    vision_start: int
    position_id_per_seconds: float
    spatial_merge_size: int = 2

    @classmethod
    def from_config(cls, cfg: ThinkerConfig) -> MediaTokens:
        return cls(
            audio=cfg.audio_token_id,
            image=cfg.image_token_id,
            video=cfg.video_token_id,
            audio_start=cfg.audio_start_token_id,
            vision_start=cfg.vision_start_token_id,
            position_id_per_seconds=cfg.position_id_per_seconds,
            spatial_merge_size=cfg.vision.spatial_merge_size,
        )


@dataclass(frozen=True)
class PromptPositions:
    """``positions`` ``[3, T]`` int64 and where generation continues."""

    positions: torch.Tensor
    next_position: int

    @property
    def rope_delta(self) -> int:
        """``next_position - T``: add it to a cache index to get a generated token's position."""
        return self.next_position - int(self.positions.shape[1])


def decode_positions(next_position: int, steps: int, offset: int = 0) -> torch.Tensor:
    """Positions ``[3, steps]`` of generated tokens ``offset .. offset+steps-1`` after a prompt."""
    start = next_position + offset
    return torch.arange(start, start + steps, dtype=torch.long)[None].expand(3, steps)


def prompt_positions(
    ids: Sequence[int] | torch.Tensor,
    tokens: MediaTokens,
    *,
    image_grids: Sequence[Sequence[int]] | torch.Tensor = (),
    video_grids: Sequence[Sequence[int]] | torch.Tensor = (),
    video_seconds_per_grid: Sequence[float] | torch.Tensor = (),
    audio_lengths: Sequence[int] | torch.Tensor | None = None,
) -> PromptPositions:
    """Positions of a whole prompt (text, images, videos, audio, audio inside videos).

    ``image_grids`` / ``video_grids``: one ``(t, h, w)`` patch grid per image /
    video in prompt order (what the vision preprocessing reports);
    ``video_seconds_per_grid``: seconds per temporal grid step of each video
    (``temporal_patch_size / fps``); ``audio_lengths``: optional encoder token
    counts of each audio clip in prompt order (clips inside videos included),
    checked against the prompt.
    """
    seq = [int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
    images = _grids(image_grids, "image_grids")
    videos = _grids(video_grids, "video_grids")
    seconds = [float(s) for s in _as_list(video_seconds_per_grid)]
    audio_expected = None if audio_lengths is None else [int(n) for n in _as_list(audio_lengths)]
    if len(seconds) != len(videos):
        raise PromptLayoutError(
            f"{len(videos)} video grids but {len(seconds)} video_seconds_per_grid values"
        )
    layout = _Layout(seq, tokens)
    used = {"image": 0, "video": 0, "audio": 0}
    audio_seen: list[int] = []
    i, n = 0, len(seq)
    while i < n:
        tok = seq[i]
        follow = seq[i + 1] if i + 1 < n else None
        if tok == tokens.vision_start and follow in (tokens.image, tokens.video):
            kind = "image" if follow == tokens.image else "video"
            grids = images if kind == "image" else videos
            if used[kind] >= len(grids):
                raise PromptLayoutError(f"{kind} block at token {i} has no {kind} grid left")
            grid = grids[used[kind]]
            step = 1.0 if kind == "image" else seconds[used[kind]]
            used[kind] += 1
            layout.text(1)
            cols = _place(
                layout.next, _vision_offsets(grid, step, tokens, f"{kind} at token {i + 1}")
            )
            layout.expect_run(i + 1, {follow}, len(cols), kind)
            layout.block(cols, cols)
            i += 1 + len(cols)
        elif tok == tokens.vision_start and follow == tokens.audio_start:
            if used["video"] >= len(videos):
                raise PromptLayoutError(f"video block at token {i} has no video grid left")
            grid, step = videos[used["video"]], seconds[used["video"]]
            used["video"] += 1
            layout.text(2)
            start = layout.next
            video_cols = _place(
                start, _vision_offsets(grid, step, tokens, f"video at token {i + 2}")
            )
            run = layout.run(i + 2, {tokens.video, tokens.audio})
            n_audio = len(run) - len(video_cols)
            if run.count(tokens.video) != len(video_cols) or n_audio < 0:
                raise PromptLayoutError(
                    f"video with audio at token {i}: grid {grid} needs {len(video_cols)} video "
                    f"placeholders, the prompt has {run.count(tokens.video)}"
                )
            audio_seen.append(n_audio)
            audio_cols = [(start + a, start + a, start + a) for a in range(n_audio)]
            order, tail = _interleave(video_cols, audio_cols)
            kinds = [tokens.video if k == 0 else tokens.audio for k, _ in order]
            if kinds != run:
                raise PromptLayoutError(
                    f"video with audio at token {i}: placeholders are not in time order"
                )
            layout.block([col for _, col in order], tail)
            i += 2 + len(run)
        elif tok == tokens.audio_start and follow == tokens.audio:
            layout.text(1)
            run = layout.run(i + 1, {tokens.audio})
            audio_seen.append(len(run))
            start = layout.next
            cols = [(start + a, start + a, start + a) for a in range(len(run))]
            layout.block(cols, cols)
            i += 1 + len(run)
        elif tok in (tokens.image, tokens.video, tokens.audio):
            raise PromptLayoutError(
                f"media placeholder {tok} at token {i} is outside a vision/audio block"
            )
        else:
            layout.text(1)
            i += 1
    for kind, grids in (("image", images), ("video", videos)):
        if used[kind] != len(grids):
            raise PromptLayoutError(
                f"{len(grids)} {kind} grids but the prompt has {used[kind]} {kind} blocks"
            )
    if audio_expected is not None and audio_expected != audio_seen:
        raise PromptLayoutError(
            f"audio_lengths {audio_expected} do not match the prompt's audio blocks {audio_seen}"
        )
    positions = torch.tensor(layout.columns, dtype=torch.long).reshape(-1, 3).t().contiguous()
    return PromptPositions(positions, layout.highest + 1)


class _Layout:
    """Columns laid out so far, the next text position, and the largest position seen."""

    def __init__(self, seq: list[int], tokens: MediaTokens):
        self.seq, self.tokens = seq, tokens
        self.columns: list[tuple[int, int, int]] = []
        self.next = 0
        self.highest = -1

    def text(self, count: int) -> None:
        for _ in range(count):
            self.columns.append((self.next, self.next, self.next))
            self.highest = max(self.highest, self.next)
            self.next += 1

    def block(self, cols: list[tuple[int, int, int]], tail: list[tuple[int, int, int]]) -> None:
        """Append a media block; text resumes one past the largest position of ``tail``."""
        self.columns.extend(cols)
        if cols:
            self.highest = max(self.highest, max(max(c) for c in cols))
        if tail:
            self.next = max(max(c) for c in tail) + 1

    def run(self, start: int, kinds: set[int]) -> list[int]:
        """The tokens from ``start`` while they are placeholders of ``kinds``."""
        end = start
        while end < len(self.seq) and self.seq[end] in kinds:
            end += 1
        return self.seq[start:end]

    def expect_run(self, start: int, kinds: set[int], length: int, what: str) -> None:
        found = len(self.run(start, kinds))
        if found != length:
            raise PromptLayoutError(
                f"{what} block at token {start}: its grid needs {length} placeholders, "
                f"the prompt has {found}"
            )


def _as_list(values) -> list:
    return values.tolist() if isinstance(values, torch.Tensor) else list(values)


def _grids(values, name: str) -> list[Grid]:
    grids = []
    for g in _as_list(values):
        if len(g) != 3:
            raise PromptLayoutError(f"{name}: each grid is (t, h, w), got {g}")
        grids.append((int(g[0]), int(g[1]), int(g[2])))
    return grids


def _place(start: int, offsets: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    return [(start + t, start + h, start + w) for t, h, w in offsets]


def _vision_offsets(
    grid: Grid, seconds_per_step: float, tokens: MediaTokens, what: str
) -> list[tuple[int, int, int]]:
    """Offsets ``(t, h, w)`` of one image/video's tokens, frame-major then row-major.

    The temporal offsets are computed in float32 with the release's operation
    order, so a value that rounds there rounds the same here before we check
    that it is a whole number.
    """
    frames, height, width = grid
    merge = tokens.spatial_merge_size
    if height % merge or width % merge:
        raise PromptLayoutError(f"{what}: grid {grid} is not a multiple of the merge size {merge}")
    rows, cols = height // merge, width // merge
    t_offsets = (
        torch.arange(frames).float()
        * torch.tensor(seconds_per_step, dtype=torch.float32)
        * torch.tensor(tokens.position_id_per_seconds, dtype=torch.float32)
    )
    if not torch.equal(t_offsets, t_offsets.round()):
        raise PromptLayoutError(
            f"{what}: {seconds_per_step} s per grid step at {tokens.position_id_per_seconds} "
            "positions per second gives fractional temporal positions, which are not supported"
        )
    return [(int(t), r, c) for t in t_offsets.tolist() for r in range(rows) for c in range(cols)]


def _interleave(
    video: list[tuple[int, int, int]], audio: list[tuple[int, int, int]]
) -> tuple[list[tuple[int, tuple[int, int, int]]], list[tuple[int, int, int]]]:
    """Merge video and audio columns in time order, as the processor orders their tokens.

    Both hold absolute columns from the same block start. Returns the merged
    ``(stream, column)`` list (stream 0 = video) and the trailing run left
    after one stream ran out: the part the release takes the block's maximum
    from.
    """
    merged: list[tuple[int, tuple[int, int, int]]] = []
    vi = ai = 0
    while vi < len(video) and ai < len(audio):
        if video[vi][0] <= audio[ai][0]:
            merged.append((0, video[vi]))
            vi += 1
        else:
            merged.append((1, audio[ai]))
            ai += 1
    tail = [(0, c) for c in video[vi:]] + [(1, c) for c in audio[ai:]]
    merged.extend(tail)
    return merged, [c for _, c in tail]
