"""The talker's input, built from what the thinker streams while it generates.

The thinker hands over, for its prompt, the token ids with two rows per
position: the layer-0 embedding (token embedding, with the encoders' rows at
media placeholders) and the hidden state after ``accept_hidden_layer``; then
the same two rows for every token it generates, as it feeds that token back
through its decoder. :class:`TalkerPrompt` accumulates them (fed incrementally
by the talker stage) and answers what the talker may compute and when.

How the release lays out the talker's input (the ``generate`` of
``Qwen3OmniMoeForConditionalGeneration``), which this reproduces:

- The prompt is cut into ChatML segments at every ``<|im_start|>``; each runs
  to the next one (the last one on through the generated tokens). The role
  is the token after ``<|im_start|>``. System segments are left out, and so
  are earlier assistant answers; user segments are kept whole, their
  ``<|im_end|>\\n`` included; the last segment must be the assistant turn
  being generated. Other roles are an error.
- A user position takes ``text_projection(layer-0 row)``, or
  ``hidden_projection(accept row)`` where the thinker's id is an audio,
  image or video placeholder.
- The assistant turn's rows ``a0, a1, a2, ...`` (``<|im_start|>``,
  ``assistant``, ``\\n``, then the generated tokens) give nine positions:
  text parts ``a0, a1, a2, pad, pad, pad, pad, bos, a3`` (``tts_pad`` /
  ``tts_bos``, also thinker layer-0 rows, also through ``text_projection``)
  plus codec parts ``-, -, -, nothink, think_bos, think_eos, speaker,
  codec_pad, codec_bos`` (embedded by the talker). So the prefill needs the
  first generated token's row: :data:`PREFILL_ROWS` assistant rows.
- Decode step ``k`` (``k = 0`` right after the prefill) adds a text row to
  the previous frame's code embeddings: ``a[4 + k]`` while the thinker has
  such a row, then ``tts_eos`` once, then ``tts_pad`` forever. The thinker
  never feeds its last sampled token (its ``<|im_end|>``, or the token at
  its length limit) back, so that token has no row and is not spoken: rows
  come only for tokens fed back.
- Positions: the thinker's multimodal rotary positions of each kept user
  segment, moved so the talker's sequence starts at 0 and each kept segment
  starts one past the previous one's last position (what the release's
  position rule gives on the talker's own token sequence), except that a
  video interleaved with its sound track counts as text there (the release
  does not pass ``use_audio_in_video`` on to its talker); the nine
  assistant positions and every later step count up by one from there.

Because the talker needs ``a[4 + k]`` at step ``k`` and the thinker may lag
behind, step ``k`` must wait for that row (or for the thinker's end) to give
the same result as the release's non-streaming run: :meth:`text_available`.

Thread safety: the stage appends rows while the engine's worker thread
reads; rows are only ever appended, and whether a step's row is available
never turns false again, so no lock is needed.
"""

from __future__ import annotations

from typing import Any

import torch

from .config import TalkerConfig

#: Assistant-turn rows the prefill needs: ``<|im_start|>``, the role, the
#: newline and the first generated token (with the usual generation prompt,
#: one token from the thinker).
PREFILL_ROWS = 4
#: Positions of the assistant part of the prefill.
ASSISTANT_POSITIONS = 9


class TalkerPrompt:
    """What the talker has received from the thinker for one request (a ``Sequence.prompt``).

    Create it with the talker's config and the request's speaker, then call
    :meth:`add_prompt` once, :meth:`add_token` per generated token the thinker
    fed back, and :meth:`finish` when the thinker stopped.
    """

    def __init__(self, config: TalkerConfig, speaker: str | int = "ethan"):
        self.config = config
        self.speaker_code = config.speaker(speaker)
        self._assistant: list[torch.Tensor] = []
        self._token_ids: list[int] = []
        self._finished = False
        self._user_length: int | None = None

    # -- feeding ------------------------------------------------------------------------

    def add_prompt(
        self,
        token_ids: list[int] | torch.Tensor,
        embeddings: torch.Tensor,
        accept_hidden: torch.Tensor | None = None,
        *,
        tts_embeddings: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> None:
        """The thinker's prompt: ids ``[T]``, layer-0 rows and accept rows ``[T, Ht]``.

        ``tts_embeddings`` ``[3, Ht]``: the thinker's layer-0 embeddings of
        ``config.tts_special_ids`` (tts_bos, tts_eos, tts_pad, in that order).
        ``positions`` ``[3, T]``: the thinker's rotary positions of the prompt
        (None: ``0..T-1``, right for prompts without images or videos).
        ``accept_hidden`` may be None when no kept user turn has media.
        """
        if self._user_length is not None:
            raise ValueError("add_prompt was already called for this request")
        cfg = self.config
        ids = [int(t) for t in (token_ids.tolist() if torch.is_tensor(token_ids) else token_ids)]
        length, width = len(ids), cfg.thinker_hidden_size
        _check_rows("embeddings", embeddings, length, width)
        if accept_hidden is not None:
            _check_rows("accept_hidden", accept_hidden, length, width)
        _check_rows("tts_embeddings", tts_embeddings, 3, width)
        if positions is not None and tuple(positions.shape) != (3, length):
            raise ValueError(f"positions {tuple(positions.shape)} must be [3, {length}]")
        segments, assistant_start = self._segments(ids)
        user = [i for segment in segments for i in segment]
        media_ids = cfg.multimodal_ids
        if positions is None:
            if any(ids[i] in (cfg.image_token_id, cfg.video_token_id) for i in user):
                raise ValueError("a prompt with images or videos needs its thinker positions")
            positions = torch.arange(length)[None].expand(3, length)
        positions = _flatten_audio_in_video(positions.to("cpu", torch.long), ids, cfg)
        keep = torch.tensor(user, dtype=torch.long)
        self._user_ids = [ids[i] for i in user]
        self._assistant_ids = ids[assistant_start:]
        media = torch.tensor([ids[i] in media_ids for i in user], dtype=torch.bool)
        if media.any() and accept_hidden is None:
            raise ValueError("the prompt has media placeholders: accept_hidden is needed there")
        rows = embeddings.detach()
        self._text_index = (~media).nonzero().squeeze(1)
        self._text_rows = rows.index_select(0, keep[~media].to(rows.device))
        self._media_index = media.nonzero().squeeze(1)
        self._media_rows = None
        if media.any():
            hidden = accept_hidden.detach()  # type: ignore[union-attr]
            self._media_rows = hidden.index_select(0, keep[media].to(hidden.device))
        self._user_positions = _rebase(positions, segments)
        self._tts = tts_embeddings.detach()
        # A copy: views would keep the whole prompt's rows alive for the request.
        self._assistant = list(rows[assistant_start:].clone().unbind(0))
        self._user_length = len(user)

    def add_token(
        self,
        token_id: int,
        embedding: torch.Tensor,
        accept_hidden: torch.Tensor | None = None,
    ) -> None:
        """One generated token the thinker fed back: its layer-0 row ``[Ht]``.

        ``accept_hidden`` is accepted for a uniform feed and not kept: the
        assistant turn is read through ``text_projection`` only.
        """
        if self._user_length is None:
            raise ValueError("add_prompt comes before add_token")
        if self._finished:
            raise ValueError("the thinker already finished this request")
        row = embedding.detach().reshape(-1)
        if row.numel() != self.config.thinker_hidden_size:
            raise ValueError(
                f"a token row has {row.numel()} values, the thinker width is "
                f"{self.config.thinker_hidden_size}"
            )
        self._token_ids.append(int(token_id))
        self._assistant.append(row)

    def add_tokens(
        self,
        token_ids: list[int] | torch.Tensor,
        embeddings: torch.Tensor,
        accept_hidden: torch.Tensor | None = None,
    ) -> None:
        """:meth:`add_token` for several tokens: ids ``[n]``, rows ``[n, Ht]``."""
        ids = token_ids.tolist() if torch.is_tensor(token_ids) else list(token_ids)
        _check_rows("embeddings", embeddings, len(ids), self.config.thinker_hidden_size)
        for i, token in enumerate(ids):
            self.add_token(token, embeddings[i])

    def finish(self) -> None:
        """The thinker stopped: no more rows will come (its last token has none)."""
        self._finished = True

    # -- what is known --------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def token_ids(self) -> list[int]:
        """Ids of the generated tokens received so far."""
        return list(self._token_ids)

    @property
    def prefill_length(self) -> int:
        """Talker positions of the prefill (known once the prompt is in)."""
        if self._user_length is None:
            raise ValueError("the prompt has not been added yet")
        return self._user_length + ASSISTANT_POSITIONS

    @property
    def prefill_ready(self) -> bool:
        """The prefill can be built (or will never be: see :attr:`speechless`)."""
        if self._user_length is None:
            return False
        return len(self._assistant) >= PREFILL_ROWS or self._finished

    @property
    def speechless(self) -> bool:
        """The thinker ended before a first token had a row: there is nothing to say.

        (The release fails on this input; the talker produces no frame.)
        """
        return self._finished and len(self._assistant) < PREFILL_ROWS

    def text_available(self, step: int) -> bool:
        """Whether the text row of decode step ``step`` (0 = first after prefill) is known."""
        return self._finished or len(self._assistant) > PREFILL_ROWS + step

    def text_row(self, step: int) -> torch.Tensor:
        """The thinker-width text row ``[Ht]`` added at decode step ``step``.

        The trailing assistant rows one per step, then ``tts_eos`` once the
        thinker has finished, then ``tts_pad``.
        """
        index = PREFILL_ROWS + step
        count = len(self._assistant)
        if index < count:
            return self._assistant[index]
        if not self._finished:
            raise ValueError(f"decode step {step}: the thinker has not sent its row yet")
        return self._tts[1] if index == count else self._tts[2]

    @property
    def next_position(self) -> int:
        """Rotary position of decode step 0 (step k is at ``next_position + k``)."""
        return self._assistant_base() + ASSISTANT_POSITIONS

    # -- building the prefill -------------------------------------------------------------

    def prefill_inputs(
        self, talker: Any, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill rows ``[L, H]`` (through the talker's projections) and positions ``[3, L]``."""
        if not self.prefill_ready or self.speechless:
            raise ValueError("the prefill needs the first generated token's row")
        cfg = self.config
        users = self._user_length or 0
        hidden = cfg.text.hidden_size
        x = torch.zeros(self.prefill_length, hidden, device=device, dtype=dtype)
        if self._text_index.numel():
            x[self._text_index.to(device)] = talker.text_projection(
                self._text_rows.to(device, dtype)
            )
        if self._media_rows is not None:
            x[self._media_index.to(device)] = talker.hidden_projection(
                self._media_rows.to(device, dtype)
            )
        a, (bos, _, pad) = self._assistant, self._tts
        text = [a[0], a[1], a[2], pad, pad, pad, pad, bos, a[3]]
        assistant = talker.text_projection(torch.stack([r.to(device, dtype) for r in text]))
        codec = torch.tensor(
            [
                cfg.codec_nothink_id,
                cfg.codec_think_bos_id,
                cfg.codec_think_eos_id,
                self.speaker_code,
                cfg.codec_pad_id,
                cfg.codec_bos_id,
            ],
            device=device,
        )
        assistant[3:] = assistant[3:] + talker.embed_codec(codec)
        x[users:] = assistant
        base = self._assistant_base()
        tail = torch.arange(base, base + ASSISTANT_POSITIONS)[None].expand(3, -1)
        positions = torch.cat([self._user_positions, tail], dim=1)
        return x, positions.to(device)

    def prefix_rows(self) -> torch.Tensor:
        """What decides each prefill position's keys and values, one int64 row each.

        For the engine's shared prompt heads: ``[source, id, 3 positions, 2 digest
        words]``. A user text position is its thinker token id (its row is that
        token's embedding); a media position adds a 16-byte digest of its accept
        row; the assistant part names its text ids and codec parts (the speaker
        among them). So a voice conversation's next turn, whose talker prompt
        starts with the earlier user turns (earlier answers are left out),
        copies them from the slot that computed them.
        """
        import hashlib

        if not self.prefill_ready or self.speechless:
            raise ValueError("the prefill needs the first generated token's row")
        users, cfg = self._user_length or 0, self.config
        rows = torch.zeros(self.prefill_length, 7, dtype=torch.long)
        rows[:users, 1] = torch.tensor(self._user_ids, dtype=torch.long)
        base = self._assistant_base()
        tail = torch.arange(base, base + ASSISTANT_POSITIONS)[None].expand(3, -1)
        rows[:, 2:5] = torch.cat([self._user_positions, tail], dim=1).T
        if self._media_rows is not None:
            rows[self._media_index, 0] = 1
            data = self._media_rows.detach().to("cpu").contiguous()
            raw = data.reshape(data.shape[0], -1).view(torch.uint8).numpy()
            for at, row in zip(self._media_index.tolist(), raw, strict=True):
                digest = hashlib.blake2b(row, digest_size=16).digest()
                rows[at, 5:] = torch.frombuffer(bytearray(digest), dtype=torch.long)
        said = [*self._assistant_ids, *self._token_ids]  # a0, a1, a2, a3 (rows by id)
        first = [*said[:3], -1, -1, -1, -1, -2, *said[3:4]]  # tts_pad -1, tts_bos -2
        codec = [-1, -1, -1, cfg.codec_nothink_id, cfg.codec_think_bos_id]
        codec += [cfg.codec_think_eos_id, self.speaker_code, cfg.codec_pad_id, cfg.codec_bos_id]
        rows[users:, 0] = 2
        rows[users:, 1] = torch.tensor(first[:ASSISTANT_POSITIONS], dtype=torch.long)
        rows[users:, 5] = torch.tensor(codec, dtype=torch.long)
        return rows

    # -- helpers --------------------------------------------------------------------------

    def _assistant_base(self) -> int:
        if self._user_length is None:
            raise ValueError("the prompt has not been added yet")
        if self._user_positions.shape[1] == 0:
            return 0
        return int(self._user_positions[0, -1]) + 1

    def _segments(self, ids: list[int]) -> tuple[list[range], int]:
        """The kept user segments (prompt index ranges), and where the assistant turn starts."""
        cfg = self.config
        starts = [i for i, t in enumerate(ids) if t == cfg.im_start_token_id]
        if not starts:
            raise ValueError("the prompt has no <|im_start|>: the talker needs a chat prompt")
        user: list[range] = []
        for n, start in enumerate(starts):
            role = ids[start + 1] if start + 1 < len(ids) else None
            if n == len(starts) - 1:
                if role != cfg.assistant_token_id:
                    break
                return user, start
            if role == cfg.user_token_id:
                user.append(range(start, starts[n + 1]))
            elif role not in (cfg.system_token_id, cfg.assistant_token_id):
                raise ValueError(
                    f"token {role} after <|im_start|> at {start} is not a system, user or "
                    "assistant role"
                )
        raise ValueError(
            "the prompt must end with the open assistant turn being generated "
            "(<|im_start|>assistant\\n, the generation prompt)"
        )


def _check_rows(what: str, rows: torch.Tensor, count: int, width: int) -> None:
    if rows.dim() != 2 or tuple(rows.shape) != (count, width):
        raise ValueError(f"{what} {tuple(rows.shape)} must be [{count}, {width}]")


def _flatten_audio_in_video(
    positions: torch.Tensor, ids: list[int], cfg: TalkerConfig
) -> torch.Tensor:
    """The thinker's positions with each video-with-its-sound-track block counted as text.

    A run of placeholders holding both video and audio tokens is a video whose
    sound track is interleaved (``use_audio_in_video``). The release hands its
    talker the image and video grids but not that flag, so the talker's own
    position rule reads such a block as plain text: one position per token,
    counting on from the token before it. Everything after the block moves by
    the same amount, keeping its own layout (other media included).
    """
    media = cfg.multimodal_ids
    out = positions.clone()
    shift, i, n = 0, 0, len(ids)
    while i < n:
        if ids[i] not in media:
            out[:, i] = positions[:, i] + shift
            i += 1
            continue
        end = i
        while end < n and ids[end] in media:
            end += 1
        run = set(ids[i:end])
        if cfg.video_token_id in run and cfg.audio_token_id in run and i > 0:
            base = int(out[0, i - 1])
            out[:, i:end] = torch.arange(base + 1, base + 1 + end - i)[None]
            if end < n:
                shift = base + (end - i) + 1 - int(positions[0, end])
        else:
            out[:, i:end] = positions[:, i:end] + shift
        i = end
    return out


def _rebase(positions: torch.Tensor, segments: list[range]) -> torch.Tensor:
    """The kept segments' positions ``[3, n]``, each moved to start one past the previous one.

    A segment starts with ``<|im_start|>``, a text token (equal streams), and
    ends with text, so its last position is its largest and the next segment
    continues from there, as the release's rule does on the talker's tokens.
    """
    parts, start = [], 0
    for segment in segments:
        part = positions[:, segment.start : segment.stop]
        part = part - int(part[0, 0]) + start
        parts.append(part)
        start = int(part[0, -1]) + 1
    if not parts:
        return torch.zeros(3, 0, dtype=torch.long)
    return torch.cat(parts, dim=1)
