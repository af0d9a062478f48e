"""MOSS-TTS prompts: the release's ``<user_inst>`` message, chat format and 33-channel ids.

A prompt is a ``[L, 33]`` id matrix: column 0 the text tokens, columns
1..32 the delayed codes of any audio in it (the pad code elsewhere). The user
turn is the release's instruction block, each field written out (``None``
where not given), rendered in the chat format of the release's template::

    <|im_start|>user\\n<user_inst>...</user_inst><|im_end|>\\n<|im_start|>assistant\\n

A reference clip for voice cloning sits in the user turn as
``<|audio_start|>``, one user slot per frame plus ``Q - 1`` more (the drain),
``<|audio_end|>``, with the clip's codes delayed under the slots.
Continuation (the release's "prefix audio" cloning) instead ends the prompt
inside an assistant audio segment: the reference's transcript is prepended
to the text and the reference frames stand as the first frames of the answer,
so the model carries on speaking in that voice.

Per-request controls the release's message exposes, all optional:
``language`` (e.g. "English", "French"), ``tokens`` (expected length in audio
frames, 12.5 per second: duration control), ``instruction``, ``quality``,
``sound_event``, ``ambient_sound``. Inline pause markers such as
``[pause 1.5s]`` (MOSS-TTS v1.5) are part of the text and pass the
normaliser unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni_qwen3_tts.tokenizer import TextTokenizer

from .config import MossTTSConfig
from .delay import apply_delay
from .normalize import normalize_text

AUDIO_PLACEHOLDER = "<|audio|>"

# The release's instruction block (processing_moss_tts.UserMessage), field order as there.
USER_FIELDS = (
    "reference",
    "instruction",
    "tokens",
    "quality",
    "sound_event",
    "ambient_sound",
    "language",
    "text",
)
_TITLES = {
    "reference": "Reference(s)",
    "instruction": "Instruction",
    "tokens": "Tokens",
    "quality": "Quality",
    "sound_event": "Sound Event",
    "ambient_sound": "Ambient Sound",
    "language": "Language",
    "text": "Text",
}


class PromptError(ValueError):
    """A request that cannot become a prompt (the caller's mistake: HTTP 400)."""


@dataclass
class MossPrompt:
    """What the engine prefills: ``ids`` ``[L, 33]`` and the request's frame cap."""

    ids: torch.Tensor
    max_frames: int

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def user_content(fields: dict[str, object]) -> str:
    """The ``<user_inst>`` block, with the release's ``str()`` of each value (``None`` too)."""
    lines = ["<user_inst>"]
    for name in USER_FIELDS:
        lines.append(f"- {_TITLES[name]}:")
        lines.append(str(fields.get(name)))
    lines.append("</user_inst>")
    return "\n".join(lines)


class PromptBuilder:
    """Builds prompt id matrices from text, controls and reference codes."""

    def __init__(self, config: MossTTSConfig, tokenizer: TextTokenizer):
        self.config, self.tokenizer = config, tokenizer
        self._special = set(tokenizer.special_tokens().values())

    def check_text(self, what: str, text: str) -> None:
        """Refuse markup that would change the prompt's structure instead of being spoken."""
        for token in sorted(self._special | {AUDIO_PLACEHOLDER}):
            if token in text:
                raise PromptError(
                    f"{what} contains {token!r}, a control token of the model's prompt; "
                    "remove it (it cannot be spoken)"
                )

    def build(
        self,
        text: str,
        *,
        max_frames: int,
        reference: torch.Tensor | None = None,
        continuation: torch.Tensor | None = None,
        reference_text: str | None = None,
        language: str | None = None,
        tokens: int | None = None,
        instruction: str | None = None,
        quality: str | None = None,
        sound_event: str | None = None,
        ambient_sound: str | None = None,
    ) -> MossPrompt:
        """A generation prompt (or a continuation one when ``continuation`` codes are given).

        ``reference``/``continuation``: codes ``[T, Q]`` of a reference clip;
        ``reference_text`` is its transcript, prepended to ``text`` for a
        continuation as the release's examples do.
        """
        for what, value in (
            ("input", text),
            ("ref_text", reference_text),
            ("language", language),
            ("instructions", instruction),
            ("quality", quality),
            ("sound_event", sound_event),
            ("ambient_sound", ambient_sound),
        ):
            if value is not None:
                self.check_text(what, value)
        spoken = (reference_text or "") + text if continuation is not None else text
        fields: dict[str, object] = {
            "reference": "None" if reference is None else f"[S1]:\n{AUDIO_PLACEHOLDER}",
            "instruction": instruction,
            "tokens": tokens,
            "quality": quality,
            "sound_event": sound_event,
            "ambient_sound": ambient_sound,
            "language": language,
            "text": normalize_text(spoken),
        }
        cfg = self.config
        user = f"<|im_start|>user\n{user_content(fields)}<|im_end|>\n"
        if continuation is None:
            user += "<|im_start|>assistant\n"  # the template's generation prompt
        user_audio = [] if reference is None else [reference]
        slot = cfg.audio_user_slot_token_id
        rows = [self._rows(user, user_audio, slot, slot)]
        if continuation is not None:
            turn = f"<|im_start|>assistant\n{AUDIO_PLACEHOLDER}<|im_end|>\n"
            assistant = self._rows(
                turn,
                [continuation],
                cfg.audio_assistant_gen_slot_token_id,
                cfg.audio_assistant_delay_slot_token_id,
            )
            # Cut inside the segment after the reference's last frame, as the release's
            # "continuation" mode does: the model goes on from there.
            keep = self._audio_start(assistant) + 1 + int(continuation.shape[0])
            rows.append(assistant[:keep])
        return MossPrompt(torch.cat(rows), max_frames)

    def _audio_start(self, rows: torch.Tensor) -> int:
        starts = (rows[:, 0] == self.config.audio_start_token_id).nonzero()
        return int(starts[-1])

    def _rows(
        self, rendered: str, audio: list[torch.Tensor], gen_slot: int, delay_slot: int
    ) -> torch.Tensor:
        """One message as ``[n, 33]`` ids: text around each placeholder, codes under its slots."""
        cfg = self.config
        pieces = rendered.split(AUDIO_PLACEHOLDER)
        if len(pieces) - 1 != len(audio):
            raise PromptError(f"{len(pieces) - 1} audio placeholders for {len(audio)} clips")
        text: list[int] = []
        codes: list[torch.Tensor] = []
        pad = cfg.audio_pad_code

        def plain(ids: list[int]) -> None:
            text.extend(ids)
            codes.append(torch.full((len(ids), cfg.n_vq), pad, dtype=torch.long))

        for index, piece in enumerate(pieces):
            plain(self.tokenizer.encode(piece))
            if index < len(audio):
                clip = torch.as_tensor(audio[index], dtype=torch.long).cpu()
                if clip.dim() != 2 or clip.shape[1] != cfg.n_vq:
                    raise PromptError(
                        f"reference codes must be [frames, {cfg.n_vq}], got {tuple(clip.shape)}"
                    )
                frames = int(clip.shape[0])
                plain([cfg.audio_start_token_id])
                if frames:
                    text.extend([gen_slot] * frames + [delay_slot] * (cfg.n_vq - 1))
                    codes.append(apply_delay(clip, pad))
                plain([cfg.audio_end_token_id])
        return torch.cat([torch.tensor(text, dtype=torch.long)[:, None], torch.cat(codes)], dim=1)
