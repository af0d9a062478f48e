"""Prompts of the three Qwen3-TTS variants, as the release formats them.

This module turns a request (text, speaker / language / instruction, or a
voice-clone reference) into a :class:`TTSPrompt`: plain token ids and codec
ids, validated against the checkpoint's tables. It imports no torch, so the
preprocessing stage can build and check prompts cheaply; the talker turns a
prompt into embeddings (:meth:`Qwen3TTSModel.embed_prompt`).

Formats (the release's chat framing):
- synthesis text: ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``
- instruction:    ``<|im_start|>user\\n{instruct}<|im_end|>\\n``
- reference text: ``<|im_start|>assistant\\n{ref_text}<|im_end|>\\n``
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import Qwen3TTSConfig


class PromptError(ValueError):
    """A request that cannot become a prompt (bad speaker, language, empty text...)."""


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def reference_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruction_text(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


@dataclass
class TTSPrompt:
    """Everything the talker needs to build its input embeddings for one request.

    ``text_ids`` is the whole framed synthesis text; the talker uses
    ``[:3]`` (role), ``[3:-5]`` (the text) like the release. ``speaker_id``
    is a codec id (CustomVoice); ``speaker_embedding`` an x-vector
    (Base). ``ref_codes`` ``[T, 16]`` and ``ref_text_ids`` enable the
    in-context voice-clone prompt. ``non_streaming`` puts the whole text
    in the prefill instead of feeding it one token per frame.
    """

    variant: str
    text_ids: list[int]
    language_id: int | None = None
    speaker_id: int | None = None
    speaker_embedding: Any = None
    instruct_ids: list[int] | None = None
    ref_text_ids: list[int] | None = None
    ref_codes: Any = None
    non_streaming: bool = False

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None and self.ref_text_ids is not None


class PromptBuilder:
    """Builds validated :class:`TTSPrompt` objects for one checkpoint."""

    def __init__(self, config: Qwen3TTSConfig, tokenizer: Any):
        self.config = config
        self.tokenizer = tokenizer

    # -- tables -------------------------------------------------------------------------

    @property
    def speakers(self) -> list[str]:
        return sorted(self.config.talker.spk_id)

    @property
    def languages(self) -> list[str]:
        """Languages a request may name: ``auto`` and every non-dialect codec language."""
        table = self.config.talker.codec_language_id
        return ["auto", *sorted(k for k in table if "dialect" not in k)]

    def _language_id(self, language: str | None, speaker: str | None) -> int | None:
        lang = (language or "auto").lower()
        talker = self.config.talker
        if lang != "auto" and (lang not in talker.codec_language_id or "dialect" in lang):
            raise PromptError(
                f"unknown language {language!r}; supported: {', '.join(self.languages)}"
            )
        language_id = None if lang == "auto" else talker.codec_language_id[lang]
        if speaker and lang in ("chinese", "auto"):
            dialect = talker.spk_is_dialect.get(speaker.lower(), False)
            if dialect:
                if dialect not in talker.codec_language_id:
                    raise PromptError(
                        f"speaker {speaker!r} names dialect {dialect!r}, which the checkpoint's "
                        "codec_language_id does not list"
                    )
                language_id = talker.codec_language_id[dialect]
        return language_id

    def _text_ids(self, text: str) -> list[int]:
        if not text or not text.strip():
            raise PromptError("text is empty")
        ids = self.tokenizer.encode(assistant_text(text))
        if len(ids) < 9:
            raise PromptError(f"text {text!r} tokenises to nothing")
        return ids

    def _require(self, variant: str) -> None:
        if self.config.tts_model_type != variant:
            raise PromptError(
                f"this checkpoint is a {self.config.tts_model_type!r} model; "
                f"a {variant!r} request cannot run on it"
            )

    # -- variants -----------------------------------------------------------------------

    def custom_voice(
        self,
        text: str,
        speaker: str,
        language: str | None = "auto",
        instruct: str | None = None,
        non_streaming: bool = True,
    ) -> TTSPrompt:
        """A named speaker (``spk_id``) and a language; instructions only above 0.6B."""
        self._require("custom_voice")
        if not speaker or speaker.lower() not in self.config.talker.spk_id:
            raise PromptError(
                f"unknown voice {speaker!r}; supported: {', '.join(self.speakers)}; map other "
                "names to these with server.voice_aliases, or set server.openai_compat = true "
                "for OpenAI's voice names"
            )
        if self.config.tts_model_size == "0b6":
            instruct = None  # the 0.6B CustomVoice model was not trained with instructions
        return TTSPrompt(
            variant="custom_voice",
            text_ids=self._text_ids(text),
            language_id=self._language_id(language, speaker),
            speaker_id=self.config.talker.spk_id[speaker.lower()],
            instruct_ids=self._instruction(instruct),
            non_streaming=non_streaming,
        )

    def voice_design(
        self,
        text: str,
        instruct: str,
        language: str | None = "auto",
        non_streaming: bool = True,
    ) -> TTSPrompt:
        """No speaker: the voice is described by a natural-language instruction."""
        self._require("voice_design")
        return TTSPrompt(
            variant="voice_design",
            text_ids=self._text_ids(text),
            language_id=self._language_id(language, None),
            instruct_ids=self._instruction(instruct),
            non_streaming=non_streaming,
        )

    def voice_clone(
        self,
        text: str,
        speaker_embedding: Any,
        language: str | None = "auto",
        ref_codes: Any = None,
        ref_text: str | None = None,
        x_vector_only: bool = False,
        non_streaming: bool = False,
    ) -> TTSPrompt:
        """Base model: the reference x-vector, plus (unless x-vector only) codes + transcript."""
        self._require("base")
        if speaker_embedding is None:
            raise PromptError("voice cloning needs the reference audio's speaker embedding")
        ref_ids = None
        if not x_vector_only:
            if not ref_text or not ref_text.strip():
                raise PromptError(
                    "voice cloning needs the reference audio's transcript (ref_text), "
                    "or x_vector_only mode"
                )
            if ref_codes is None:
                raise PromptError("voice cloning needs the reference audio's codes")
            ref_ids = self.tokenizer.encode(reference_text(ref_text))
            if len(ref_ids) < 6:
                raise PromptError(f"reference text {ref_text!r} tokenises to nothing")
        return TTSPrompt(
            variant="base",
            text_ids=self._text_ids(text),
            language_id=self._language_id(language, None),
            speaker_embedding=speaker_embedding,
            ref_text_ids=ref_ids,
            ref_codes=None if x_vector_only else ref_codes,
            non_streaming=non_streaming,
        )

    def _instruction(self, instruct: str | None) -> list[int] | None:
        if not instruct:
            return None
        return self.tokenizer.encode(instruction_text(instruct))
