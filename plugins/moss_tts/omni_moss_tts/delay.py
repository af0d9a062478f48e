"""The delay pattern: codebook ``k`` of a frame sits ``k`` positions later than codebook 0.

Why: one step of the backbone predicts all 32 codebooks at once, from 32
heads on one hidden state. Shifting codebook ``k`` by ``k`` steps means that
when the model predicts codebook ``k`` of frame ``f`` it has already seen
codebooks ``0..k-1`` of that frame in its input, which is what a depth
transformer would otherwise provide.

Layout within an audio segment (the text channel holds ``audio_start``, then
a gen slot per frame, then delay slots): the position ``r`` steps after
``audio_start`` carries codebook ``k`` of frame ``r - 1 - k`` (the pad code
where that frame does not exist). A segment of ``T`` frames therefore takes
``T + Q - 1`` positions after ``audio_start``; the last ``Q - 1`` are the
drain, whose text tokens are delay slots.

:class:`DelayTracker` is the release's generation state machine for one
sequence, stepped one position at a time; it says what the text channel must
or may be, which codebooks to sample, and which frames a step completed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import MossTTSConfig


def apply_delay(codes: torch.Tensor, pad: int) -> torch.Tensor:
    """Frames ``[T, Q]`` -> delayed rows ``[T + Q - 1, Q]`` (``pad`` where no frame is)."""
    frames, books = codes.shape
    out = torch.full((frames + books - 1, books), pad, dtype=codes.dtype, device=codes.device)
    for k in range(books):
        out[k : k + frames, k] = codes[:, k]
    return out


def undelay(rows: torch.Tensor) -> torch.Tensor:
    """Delayed rows ``[T + Q - 1, Q]`` -> frames ``[T, Q]`` (the inverse of :func:`apply_delay`)."""
    total, books = rows.shape
    frames = total - books + 1
    if frames < 0:
        raise ValueError(f"{total} delayed rows cannot hold {books} codebooks")
    return torch.stack([rows[k : k + frames, k] for k in range(books)], dim=1)


@dataclass
class TextRule:
    """What the text channel may be at one step.

    ``forced``: the token to use (no sampling); otherwise sample, with
    ``allowed`` (only these ids) or ``banned`` (every id but these).
    """

    forced: int | None = None
    allowed: tuple[int, ...] | None = None
    banned: tuple[int, ...] = ()


@dataclass
class DelayTracker:
    """One sequence's place in the release's generation loop (``MossTTSDelayModel.generate``).

    ``audio_length``: positions since the current segment's ``audio_start``,
    counting it (0 outside audio). ``drain``: steps since the first delay
    slot (``None`` before it). ``frames``: the current segment's frames whose
    codebook 0 exists; ``frame_cap`` forces the delay slot when reached, so a
    capped request still ends with complete frames (the release just stops).
    ``prefix_frames``: frames of a continuation prompt's audio (context).
    """

    cfg: MossTTSConfig
    frame_cap: int
    audio_length: int = 0
    drain: int | None = None
    in_audio: bool = False
    stopped: bool = False
    step: int = 0
    frames: int = 0
    prefix_frames: int = 0
    partial: dict[int, list[int | None]] = field(default_factory=dict)

    @classmethod
    def after_prompt(cls, cfg: MossTTSConfig, prompt_ids: torch.Tensor, frame_cap: int):
        """The state after a prompt ``[L, 33]``: inside audio if it ends in a continuation.

        A continuation prompt ends with the first rows of an assistant audio
        segment (``audio_start`` and gen slots over delayed reference codes);
        generation then carries on inside that segment, as in the release.
        """
        tracker = cls(cfg, frame_cap)
        text = prompt_ids[:, 0].tolist()
        last = text[-1] if text else None
        if last in (cfg.audio_start_token_id, cfg.audio_assistant_gen_slot_token_id):
            starts = [i for i, t in enumerate(text) if t == cfg.audio_start_token_id]
            if starts:
                start = starts[-1]
                tracker.in_audio = True
                tracker.audio_length = len(text) - start
                tracker.frames = tracker.prefix_frames = tracker.audio_length - 1
                tracker._seed_partial(prompt_ids[start + 1 :, 1:])
        return tracker

    def _seed_partial(self, rows: torch.Tensor) -> None:
        """Record the prompt's codes of the frames that the next steps complete."""
        books = self.cfg.n_vq
        for r, row in enumerate(rows.tolist()):
            for k in range(books):
                frame = r - k
                if frame >= 0 and frame >= self.prefix_frames - (books - 1):
                    self.partial.setdefault(frame, [None] * books)[k] = row[k]

    def complete_prefix(self, rows: torch.Tensor) -> torch.Tensor:
        """Frames of the prompt's audio complete within the prompt ``[n, Q]`` (context)."""
        books = self.cfg.n_vq
        done = max(self.prefix_frames - (books - 1), 0)
        if done == 0:
            return rows.new_zeros(0, books)
        return undelay(rows[: done + books - 1])[:done]

    # -- one step -------------------------------------------------------------

    def text_rule(self) -> TextRule:
        cfg, books = self.cfg, self.cfg.n_vq
        if self.drain is not None:  # the drain: delay slots, then the end of the segment
            end = self.drain == books
            return TextRule(
                forced=cfg.audio_end_token_id if end else cfg.audio_assistant_delay_slot_token_id
            )
        banned: list[int] = []
        if self.step == 0:
            banned.append(cfg.audio_assistant_delay_slot_token_id)
        if self.step <= books:
            banned.append(cfg.im_end_token_id)
        if self.in_audio:
            if self.new_frames + 1 >= self.frame_cap:
                # Our cap: this step's codebook 0 is the last frame allowed, so end the
                # segment here as the model would (the release instead stops mid-drain).
                return TextRule(forced=cfg.audio_assistant_delay_slot_token_id)
            allowed = (
                cfg.audio_assistant_gen_slot_token_id,
                cfg.audio_assistant_delay_slot_token_id,
            )
            return TextRule(allowed=tuple(t for t in allowed if t not in banned))
        banned += [
            cfg.pad_token_id,
            cfg.audio_assistant_gen_slot_token_id,
            cfg.audio_assistant_delay_slot_token_id,
            cfg.audio_end_token_id,
        ]
        return TextRule(banned=tuple(banned))

    def sampled_books(self) -> range:
        """The codebooks sampled at this step (the rest are the pad code)."""
        books = self.cfg.n_vq
        first = 0 if self.drain is None else self.drain
        last = min(self.audio_length, books)
        return range(first, max(first, last))

    def advance(self, text: int, codes: list[int]) -> list[tuple[int, list[int]]]:
        """Take this step's text token and codebook row; return the frames it completed.

        Each completed frame comes as ``(index, codes)``, ``index`` counted
        from the segment's first frame (a continuation's reference frames
        first).
        """
        cfg, books = self.cfg, self.cfg.n_vq
        completed: list[tuple[int, list[int]]] = []
        for k in self.sampled_books():
            frame = self.audio_length - 1 - k
            slot = self.partial.setdefault(frame, [None] * books)
            slot[k] = codes[k]
            if k == 0:
                self.frames += 1
            if k == books - 1:
                done = self.partial.pop(frame)
                completed.append((frame, [int(c) for c in done]))  # type: ignore[arg-type]
        if text == cfg.im_end_token_id:
            self.stopped = True
        if text == cfg.audio_start_token_id:
            self.in_audio = True
        if text in (
            cfg.audio_start_token_id,
            cfg.audio_assistant_gen_slot_token_id,
            cfg.audio_assistant_delay_slot_token_id,
        ):
            self.audio_length += 1
        if text == cfg.audio_end_token_id:
            self.in_audio = False
            self.audio_length = 0
            self.partial.clear()
        if self.drain is None and text == cfg.audio_assistant_delay_slot_token_id:
            self.drain = 0
        if self.drain is not None:
            self.drain += 1
            if self.drain > books:
                self.drain = None
        self.step += 1
        return completed

    @property
    def new_frames(self) -> int:
        """Frames generated so far (a continuation's prompt frames not counted)."""
        return self.frames - self.prefix_frames
