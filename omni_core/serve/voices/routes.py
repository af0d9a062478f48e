"""Voices: which names a speech request may use, and ``/v1/audio/voices`` to list, upload, delete.

A request's ``voice`` is resolved here, once, for every speech API (HTTP,
WebSocket, batch) through :meth:`Voices.apply`, which ``Service.admit``
calls:

1. an alias (``server.voice_aliases``, e.g. OpenAI's ``alloy``) becomes the
   voice it names, so unmodified OpenAI clients work;
2. an uploaded voice becomes its stored clone prompt (``voice_prompt``) and
   transcript (``ref_text``), computed when it was uploaded;
3. a built-in voice (the model's own, ``PipelineConfig.builtin_voices``)
   goes to the pipeline as it is;
4. on a pipeline that clones, :data:`CLONE_VOICE` (``"default"``), unless
   the model has a voice of that name, goes to the pipeline as no voice:
   clone from this request's ``ref_audio`` (the OpenAI SDK requires a
   voice, and a Base checkpoint has none of its own), or without one the
   model's default voice;
5. anything else is a 400 that lists the voices and names
   ``server.voice_aliases`` (and the OpenAI preset, ``server.openai_compat``),
   when the server knows them (for a hub model not yet downloaded it does
   not: the pipeline judges).

With ``server.openai_compat`` the aliases also hold OpenAI's voice names
(:func:`.openai_compat.voice_aliases`); the operator's entries win.

An upload (multipart: ``name``, ``file``, optional ``transcript``, and
``consent``, which must be true) is decoded under the upload limits (1-30 s,
10 MB), sent through the pipeline as an enrollment request (the voices
contract in CONTRIBUTING), and the returned clone prompt is stored.

Uploads and deletes of one name are serialized: the first request claims
the name until it is done, and any other that arrives meanwhile gets a 409
at once (the store's rename never replaces a voice either), so a race is
never a 500. A full or read-only disk is a 507; no response names a host
path (the log does).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from ...media import AudioLimits
from ...media.audio_input import decode_audio
from ...media.errors import MediaError
from ...runtime.coordinator import RequestFailed
from ..common import openai_compat
from ..common.errors import APIError
from .store import Voice, VoiceStore, VoiceStoreError

log = logging.getLogger("omni.serve")
PATH = "/v1/audio/voices"
UPLOAD_LIMITS = AudioLimits(max_seconds=30.0, min_seconds=1.0, max_bytes=10 * 1024 * 1024)
ENROLL_TIMEOUT = 120.0
TRUE = {"true", "1", "yes", "on"}
CLONE_VOICE = "default"  # on a cloning pipeline: "clone from this request's ref_audio"
ALIASES_HINT = (
    "map other names to these with server.voice_aliases "
    """(e.g. --server.voice_aliases '{alloy = "NAME"}'), or set server.openai_compat = true """
    "to map all of OpenAI's voice names"
)


@dataclass
class Voices:
    pipeline: str
    cloning: bool
    builtin: list[str] | None
    aliases: dict[str, str]
    store: VoiceStore | None
    audio_stage: str | None
    problems: list[tuple[str, str]] = field(default_factory=list)
    changing: set[str] = field(default_factory=set)  # names an upload or delete holds
    # a transcript becomes the ref_text of every request in the voice: the same limit
    max_transcript_chars: int = 4096

    @classmethod
    def of(cls, pipeline_cls: Any, config: Any) -> Voices:
        server = config.server
        builtin = config.builtin_voices()
        store = None
        if server.voices_dir:
            store = VoiceStore.open(
                server.voices_dir, pipeline_cls.pipeline_name, config.model_path
            )
        cloning = bool(pipeline_cls.voice_cloning)
        aliases = dict(server.voice_aliases)
        if server.openai_compat:  # OpenAI's names onto the model's voices; explicit ones win
            clone = CLONE_VOICE if cloning else None
            aliases = {**openai_compat.voice_aliases(builtin, clone), **aliases}
        return cls(
            pipeline_cls.pipeline_name,
            cloning,
            None if builtin is None else list(builtin),
            aliases,
            store,
            pipeline_cls.audio_stage,
            list(store.problems) if store else [],
            max_transcript_chars=server.max_input_chars,
        )

    # -- resolving a request's voice ---------------------------------------------

    def names(self) -> list[str]:
        uploaded = sorted(self.store.voices) if self.store else []
        return [*(self.builtin or []), *uploaded]

    def apply(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with its voice resolved (see the module docstring); APIError(400) if unknown."""
        if data.get("voice_prompt") is not None:
            raise APIError(
                400,
                "voice_prompt is set by the server from an uploaded voice; "
                "send that voice's name as voice",
                param="voice_prompt",
            )
        name = data.get("voice")
        if not isinstance(name, str) or not name:
            return data
        name = self.aliases.get(name, name)
        stored = self.store.voices.get(name) if self.store else None
        if stored is not None:
            if data.get("ref_audio"):
                raise APIError(
                    400,
                    f"voice {name!r} is an uploaded voice; do not send ref_audio with it",
                    param="ref_audio",
                )
            out = {**data, "voice": None, "voice_prompt": stored.prompt}
            if stored.transcript and not data.get("ref_text"):
                out["ref_text"] = stored.transcript
            return out
        known = self.builtin
        own = None if known is None else {v.lower() for v in known}
        if self.cloning and name.lower() == CLONE_VOICE and (own is None or CLONE_VOICE not in own):
            return {**data, "voice": None}  # clone from ref_audio (or the model's default)
        if own is not None and name.lower() not in own:
            voices = ", ".join(self.names()) or "none"
            hint = ""
            if self.cloning:
                hint = (
                    f" (or {CLONE_VOICE!r} with ref_audio to clone from it; "
                    "upload one at POST /v1/audio/voices)"
                )
            raise APIError(
                400,
                f"unknown voice {name!r}; voices: {voices}{hint}; {ALIASES_HINT}",
                param="voice",
            )
        return {**data, "voice": name}

    # -- GET / POST / DELETE ------------------------------------------------------

    def listing(self) -> dict[str, Any]:
        data: list[dict[str, Any]] = [
            {"name": name, "type": "builtin", "in_context": False} for name in self.builtin or []
        ]
        if self.store:
            data += [voice.describe() for _, voice in sorted(self.store.voices.items())]
        return {
            "object": "list",
            "data": data,
            "aliases": dict(self.aliases),
            "cloning": self.cloning,
            "uploads": self.cloning and self.store is not None,
            "builtin_known": self.builtin is not None,
            "skipped": [{"name": n, "reason": why} for n, why in self.problems],
        }

    async def upload(self, form: Any, service: Any) -> dict[str, Any]:
        if not self.cloning:
            raise APIError(
                400,
                f"pipeline {self.pipeline!r} cannot clone voices: it speaks only with its "
                f"own voices ({', '.join(self.builtin or []) or 'none'})",
                code="voice_cloning_unsupported",
            )
        if self.store is None:
            raise APIError(
                400,
                "voice uploads are off on this server: set server.voices_dir "
                "(--server.voices_dir DIR) to store them",
            )
        name = _field(form, "name")
        if str(form.get("consent", "")).strip().lower() not in TRUE:
            raise APIError(
                400,
                "uploading a voice needs consent: true, confirming the speaker agreed to "
                "having their voice cloned",
                param="consent",
            )
        try:
            self.store.check_name(name)
        except VoiceStoreError as exc:
            raise store_error(exc) from None
        if name.lower() in {v.lower() for v in self.builtin or []} or name in self.aliases:
            raise APIError(400, f"{name!r} is already a voice of this server", param="name")
        with self.claim(name):
            voice = await self._upload(self.store, name, form, service)
        log.info("voices: stored %r (%.1f s)", name, voice.duration)
        return voice.describe()

    async def _upload(self, store: VoiceStore, name: str, form: Any, service: Any) -> Voice:
        upload = form.get("file")
        if upload is None or not hasattr(upload, "read"):
            raise APIError(
                400, "the voice's audio is missing: send it as the 'file' part", param="file"
            )
        transcript = str(form.get("transcript") or "").strip() or None
        if transcript is not None and len(transcript) > self.max_transcript_chars:
            raise APIError(
                400,
                f"'transcript' is {len(transcript)} characters; this server takes at most "
                f"{self.max_transcript_chars} (server.max_input_chars)",
                param="transcript",
                code="string_above_max_length",
            )
        raw = await upload.read(UPLOAD_LIMITS.max_bytes + 1)
        try:  # bounded, but seconds of audio still take a while: off the event loop
            clip = await anyio.to_thread.run_sync(decode_audio, raw, "file", UPLOAD_LIMITS)
        except MediaError as exc:
            raise APIError(400, str(exc), param="file") from None
        prompt = await self._enroll(service, raw, transcript)
        try:
            return await anyio.to_thread.run_sync(
                lambda: store.add(
                    name,
                    prompt,
                    transcript=transcript,
                    duration=clip.seconds,
                    reference=raw,
                    reference_format=clip.format,
                )
            )
        except VoiceStoreError as exc:
            raise store_error(exc) from None

    @contextmanager
    def claim(self, name: str) -> Iterator[None]:
        """Hold ``name`` for one upload or delete; APIError(409) while another holds it.

        Why not wait for the holder: the waiter's outcome is decided by the
        holder (an upload makes a second one a conflict anyway), and a
        client told to retry holds no connection meanwhile. The event loop
        runs one request's code at a time, so a set is the lock.
        """
        if name in self.changing:
            raise APIError(
                409,
                f"voice {name!r} is being changed by another request, retry",
                param="name",
                code="voice_busy",
            )
        self.changing.add(name)
        try:
            yield
        finally:
            self.changing.discard(name)

    async def _enroll(self, service: Any, raw: bytes, transcript: str | None) -> dict[str, Any]:
        data = {
            "voice_enroll": True,
            "ref_audio": base64.b64encode(raw).decode("ascii"),
            "ref_text": transcript,
        }
        handle = await service.admit(data, {"api": "voice"})
        try:
            with anyio.fail_after(ENROLL_TIMEOUT):
                outputs = await handle.result()
        except TimeoutError:
            await service.finish(handle, "timed out")
            raise APIError(504, f"computing the voice took over {ENROLL_TIMEOUT:g} s") from None
        except RequestFailed as exc:
            if exc.client_error:
                raise APIError(400, exc.message, param="file") from None
            log.error("voice enrollment %s failed: %s", handle.request_id, exc.message)
            raise APIError(500, f"internal server error (request id {handle.request_id})") from None
        prompt = (outputs.get(self.audio_stage) or {}).get("voice_prompt")
        if not isinstance(prompt, dict) or not prompt:
            raise APIError(
                500,
                f"pipeline {self.pipeline!r} declares voice cloning but its stage "
                f"{self.audio_stage!r} returned no voice_prompt",
            )
        return prompt

    def delete(self, name: str) -> dict[str, Any]:
        if name.lower() in {v.lower() for v in self.builtin or []}:
            raise APIError(400, f"{name!r} is a voice of the model; it cannot be deleted")
        if self.store is None:
            raise APIError(404, f"no uploaded voice named {name!r}", code="voice_not_found")
        with self.claim(name):
            try:
                deleted = self.store.delete(name)
            except VoiceStoreError as exc:
                raise store_error(exc) from None
        if not deleted:
            raise APIError(404, f"no uploaded voice named {name!r}", code="voice_not_found")
        return {"name": name, "deleted": True}


def store_error(exc: VoiceStoreError) -> APIError:
    """The answer to a refusal of the store: 400 bad name, 409 taken, 507 disk full/read-only."""
    code = {409: "voice_exists", 507: "insufficient_storage"}.get(exc.status)
    return APIError(exc.status, str(exc), param="name" if exc.status < 500 else None, code=code)


def _field(form: Any, key: str) -> str:
    value = form.get(key)
    if not isinstance(value, str) or not value.strip():
        raise APIError(400, f"the form field {key!r} is missing", param=key)
    return value.strip()
