"""The preprocessing stage: a transcription request in; the mel, the prompt and sampling out.

It reads what the client sent, so everything a client can get wrong is
refused here with a 400 naming the field. The request arrives chat-shaped
(``serve/transcribe/request.py``): the clip is the user turn's audio part,
and ``data["transcription"]`` carries the task, the language and the
context prompt. A chat-shaped request without it (the realtime API's input
transcription) is a transcription of its last audio part, language detected,
no context: the chat's instruction text is not context for this model.

``translate`` (``/v1/audio/translations``) forces English as the answer's
language, as the release's vLLM backend does for a target language; the
release trains no translation task, so expect a transcript when the speech
is not English.

A clip longer than ``factory.max_piece_seconds`` (1200 s, the release's
value; ``factory.max_aligned_piece_seconds``, 180 s, when word timings are
asked) is cut into pieces at quiet points (:mod:`.split`), each with its own
mel and prompt (same context, same forced language): the asr stage runs
them as separate sequences and the text stages join their answers. The
whole clip is still bounded first by ``factory.max_audio_seconds`` (what one
request may cost the server), and every piece's prompt by
``factory.max_prompt_tokens``. One piece is sent as before (``token_ids``,
``mel``); several as ``pieces``, a list of ``{token_ids, mel, offset}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from omni_core import RequestError
from omni_core.engine.interface import SamplingParams, check_sampling
from omni_core.media import AudioLimits
from omni_core.media.audio_input import decode_base64_audio
from omni_qwen3_omni.audio.mel import SAMPLE_RATE, audio_token_count, log_mel
from omni_qwen3_omni.chat import ChatPrompter

from .languages import canonical
from .loading import read_config
from .prompt import prompt_ids
from .source import resolve_model_path
from .split import MAX_ALIGNED_PIECE_SECONDS, MAX_PIECE_SECONDS, split_clip


@dataclass(frozen=True)
class Limits:
    max_audio_seconds: float
    max_media_bytes: int
    max_tokens: int
    max_prompt_tokens: int
    max_piece_seconds: float = MAX_PIECE_SECONDS
    max_aligned_piece_seconds: float = MAX_ALIGNED_PIECE_SECONDS


class Preprocessing:
    def __init__(self, root: Path, limits: Limits):
        self.config = read_config(root)
        self.prompter = ChatPrompter.from_dir(root)
        self.limits = limits

    async def run(self, request: Any) -> dict[str, Any]:
        data = dict(request.data or {})
        where, encoded = _audio_part(data.get("messages"))
        asked = data.get("transcription") or {}
        language = asked.get("language")
        if asked.get("task") == "translate":
            language = "English"
        if language:
            try:
                language = canonical(str(language), self.config.support_languages)
            except ValueError as exc:
                raise RequestError(str(exc)) from None
        context = str(asked.get("prompt") or "")
        words = "word" in (asked.get("timestamps") or [])
        sampling = self._sampling(data.get("sampling") or {})
        prepared = await anyio.to_thread.run_sync(
            self._prepare, where, encoded, context, language, sampling, words
        )
        return {**prepared, "words": words}

    def _prepare(
        self,
        where: str,
        encoded: Any,
        context: str,
        language: str | None,
        sampling: dict,
        words: bool,
    ) -> dict[str, Any]:
        limits = AudioLimits(
            max_seconds=self.limits.max_audio_seconds,
            max_bytes=self.limits.max_media_bytes,
            max_samples=int(self.limits.max_audio_seconds * 96_000),  # 48 kHz stereo
        )
        clip = decode_base64_audio(encoded, f"{where}.data", limits)
        mono = clip.samples.mean(axis=1).astype(np.float32)
        if clip.rate != SAMPLE_RATE:
            import soxr

            mono = soxr.resample(mono, clip.rate, SAMPLE_RATE).astype(np.float32)
        if mono.shape[0] < SAMPLE_RATE // 100:
            raise RequestError(f"{where}: the clip is shorter than 10 ms")
        longest = self.limits.max_aligned_piece_seconds if words else self.limits.max_piece_seconds
        pieces = [
            {**self._piece(piece.samples, context, language), "offset": piece.offset}
            for piece in split_clip(mono, SAMPLE_RATE, longest)
        ]
        common = {
            "audio_token_id": self.config.audio_token_id,
            "language": language,
            "sampling": sampling,
        }
        if len(pieces) == 1:
            return {"token_ids": pieces[0]["token_ids"], "mel": pieces[0]["mel"], **common}
        return {"pieces": pieces, **common}

    def _piece(self, samples: np.ndarray, context: str, language: str | None) -> dict[str, Any]:
        """One piece's mel and prompt ids (the whole clip's, when it is one piece)."""
        mel = log_mel(samples)
        rows = audio_token_count(int(mel.shape[-1]))
        ids = prompt_ids(self.prompter, context, rows, language)
        if len(ids) > self.limits.max_prompt_tokens:
            raise RequestError(
                f"the prompt takes {len(ids)} tokens (the clip's {rows} and the context's); "
                f"this server takes at most {self.limits.max_prompt_tokens} "
                "(factory.max_prompt_tokens of the preprocessing stage)",
                hint="send a shorter clip or a shorter prompt, or lower "
                "factory.max_piece_seconds so that long clips are cut into shorter pieces",
            )
        return {"token_ids": ids, "mel": mel}

    def _sampling(self, given: dict[str, Any]) -> dict[str, Any]:
        max_tokens = given.get("max_tokens") or self.limits.max_tokens
        if max_tokens > self.limits.max_tokens:
            raise RequestError(
                f"max_tokens is {max_tokens}; this server allows at most {self.limits.max_tokens} "
                "(factory.max_tokens of the preprocessing stage)"
            )
        params = SamplingParams(
            temperature=float(given.get("temperature") or 0.0),
            top_k=int(given.get("top_k") or 0),
            top_p=float(given.get("top_p") or 1.0),
            repetition_penalty=float(given.get("repetition_penalty") or 1.0),
            seed=given.get("seed"),
            max_new_tokens=int(max_tokens),
        )
        check_sampling(params)
        return dict(params.__dict__)


def _audio_part(messages: Any) -> tuple[str, Any]:
    """Where the request's clip is, and its base64 data: the last user audio part."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list holding one audio part")
    found = None
    for m_index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for p_index, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "input_audio":
                value = part.get("input_audio")
                where = f"messages.{m_index}.content.{p_index}.input_audio"
                if not isinstance(value, dict) or "data" not in value:
                    raise RequestError(f"{where}: must be an object with base64 'data'")
                found = (where, value["data"])
    if found is None:
        raise RequestError("qwen3-asr transcribes one clip: the request holds no input_audio part")
    return found


def create_preprocessing(
    model_path: str,
    max_audio_seconds: float = 300.0,
    max_media_bytes: int = 64 * 1024 * 1024,
    max_tokens: int = 4096,
    max_prompt_tokens: int = 32768,
    max_piece_seconds: float = MAX_PIECE_SECONDS,
    max_aligned_piece_seconds: float = MAX_ALIGNED_PIECE_SECONDS,
) -> Preprocessing:
    limits = Limits(
        max_audio_seconds,
        max_media_bytes,
        max_tokens,
        max_prompt_tokens,
        max_piece_seconds,
        max_aligned_piece_seconds,
    )
    return Preprocessing(resolve_model_path(model_path).path, limits)
