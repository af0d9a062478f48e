"""Uploaded voices on disk: one directory per voice, written atomically, read at start-up.

A voice is what a pipeline needs to speak in it, computed once at upload
(the clone prompt: a Qwen3-TTS Base x-vector and reference codes, MOSS-TTS
reference codes) plus what was uploaded and agreed to::

    <voices_dir>/<name>/voice.json       name, transcript, consent, duration, pipeline, model
    <voices_dir>/<name>/prompt.npz       the clone prompt's arrays (numpy, no pickles)
    <voices_dir>/<name>/reference.<ext> the clip as uploaded (to enroll again for another model)

Why a directory per voice: a voice is several files that must appear and
disappear together. Each is written into a hidden ``.tmp-*`` directory,
flushed, then renamed into place in one step; a delete renames the directory
away first. A crash leaves either the whole voice or none of it (leftover
``.tmp-*``/``.trash-*`` directories are removed at the next start).

At start-up an entry that cannot be read, or that was enrolled for another
pipeline or model, is skipped and listed in :attr:`VoiceStore.problems`
(the server logs them); it never stops the server.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("omni.serve")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
FORMAT_VERSION = 1


class VoiceStoreError(ValueError):
    """A voice that cannot be stored as asked (a bad name, a name taken)."""


@dataclass
class Voice:
    name: str
    pipeline: str
    model: str
    created: int
    duration: float
    transcript: str | None
    prompt: dict[str, Any] = field(repr=False)  # name -> numpy array

    def describe(self) -> dict[str, Any]:
        """The public view of ``GET /v1/audio/voices`` (no arrays, no paths)."""
        return {
            "name": self.name,
            "type": "uploaded",
            "created": self.created,
            "duration_seconds": round(self.duration, 3),
            "transcript": self.transcript,
            "in_context": bool(self.transcript),
        }


class VoiceStore:
    """The voices of one pipeline and model, kept under ``root``."""

    def __init__(self, root: Path, pipeline: str, model: str):
        self.root, self.pipeline, self.model = root, pipeline, model
        self.voices: dict[str, Voice] = {}
        self.problems: list[tuple[str, str]] = []  # (entry, why it was skipped)

    @classmethod
    def open(cls, root: str | os.PathLike[str], pipeline: str, model: str) -> VoiceStore:
        store = cls(Path(root).expanduser(), pipeline, model)
        store.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        store._load()
        return store

    def _load(self) -> None:
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(entry, ignore_errors=True)  # an interrupted write or delete
                continue
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            try:
                voice = self._read(entry)
            except Exception as exc:  # any unreadable entry is skipped, never fatal
                self._problem(entry.name, f"unreadable ({type(exc).__name__}: {exc})")
                continue
            if (voice.pipeline, voice.model) != (self.pipeline, self.model):
                self._problem(
                    entry.name,
                    f"enrolled for {voice.pipeline} {voice.model!r}, not this server's "
                    f"{self.pipeline} {self.model!r}; upload it again here",
                )
                continue
            self.voices[voice.name] = voice

    def _problem(self, name: str, why: str) -> None:
        self.problems.append((name, why))
        log.warning("voices: skipped %s/%s: %s", self.root, name, why)

    @staticmethod
    def _read(entry: Path) -> Voice:
        import numpy as np

        meta = json.loads((entry / "voice.json").read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT_VERSION or meta.get("name") != entry.name:
            raise ValueError(
                f"voice.json: format {meta.get('format')!r}, name {meta.get('name')!r}"
            )
        with np.load(entry / "prompt.npz", allow_pickle=False) as arrays:
            prompt = {key: arrays[key] for key in arrays.files}
        if not prompt:
            raise ValueError("prompt.npz holds no arrays")
        return Voice(
            name=meta["name"],
            pipeline=str(meta["pipeline"]),
            model=str(meta["model"]),
            created=int(meta["created"]),
            duration=float(meta["duration"]),
            transcript=meta.get("transcript"),
            prompt=prompt,
        )

    def check_name(self, name: str) -> None:
        if not NAME.match(name):
            raise VoiceStoreError(
                f"voice name {name!r} must be 1-64 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit"
            )
        if name in self.voices:
            raise VoiceStoreError(f"a voice named {name!r} exists; delete it first")

    def add(
        self,
        name: str,
        prompt: dict[str, Any],
        *,
        transcript: str | None,
        duration: float,
        reference: bytes,
        reference_format: str,
    ) -> Voice:
        """Write a voice atomically and make it usable; VoiceStoreError if the name is taken."""
        import numpy as np

        self.check_name(name)
        voice = Voice(
            name, self.pipeline, self.model, int(time.time()), duration, transcript, prompt
        )
        staging = self.root / f".tmp-{uuid.uuid4().hex}"
        staging.mkdir(mode=0o700)
        try:
            buffer = io.BytesIO()
            np.savez(buffer, **{k: np.asarray(v) for k, v in prompt.items()})
            meta = {
                "format": FORMAT_VERSION,
                "name": name,
                "pipeline": self.pipeline,
                "model": self.model,
                "created": voice.created,
                "duration": duration,
                "transcript": transcript,
                "consent": True,  # uploads without consent are refused before this
                "reference": f"reference.{reference_format}",
            }
            _write(staging / "prompt.npz", buffer.getvalue())
            _write(staging / f"reference.{reference_format}", reference)
            _write(staging / "voice.json", json.dumps(meta, indent=1).encode())
            os.rename(staging, self.root / name)  # fails if it appeared meanwhile
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _fsync_dir(self.root)
        self.voices[name] = voice
        return voice

    def delete(self, name: str) -> bool:
        """Remove a voice (False if there is none by that name)."""
        if self.voices.pop(name, None) is None:
            return False
        trash = self.root / f".trash-{uuid.uuid4().hex}"
        os.rename(self.root / name, trash)
        _fsync_dir(self.root)
        shutil.rmtree(trash, ignore_errors=True)
        return True


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
