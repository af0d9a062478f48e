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

Why descriptors everywhere: the directory is checked at start like the
runtime directory (a real directory of ours that nobody else can write to,
see :func:`omni_core.schema.deployment.unsafe_voices_dir`), then held open,
and every file below it is reached relative to that descriptor with
``O_NOFOLLOW``: a link planted anywhere below it is never followed, and only
regular files are read (a FIFO or device planted as ``voice.json`` is
skipped, never opened in a way that could block).

At start-up an entry that cannot be read, or that was enrolled for another
pipeline or model, is skipped and listed in :attr:`VoiceStore.problems`
(the server logs them with their paths; clients see only the names).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import re
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...schema.deployment import unsafe_voices_dir
from .files import DIR_FLAGS as _DIR_FLAGS
from .files import Skipped as _Skipped
from .files import fsync as _fsync
from .files import lexists as _lexists
from .files import open_entry as _open_entry
from .files import read_regular as _read_regular
from .files import remove_tree as _remove_tree
from .files import write_file as _write_file

log = logging.getLogger("omni.serve")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
EXTENSION = re.compile(r"^[a-z0-9]{1,8}$")
FORMAT_VERSION = 1
MAX_META_BYTES = 1024 * 1024  # voice.json: a name, a transcript, a few numbers
MAX_PROMPT_BYTES = 64 * 1024 * 1024  # prompt.npz: an x-vector and reference codes
# A full disk, a quota or a read-only mount: the operator's to fix, not a bug (507).
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


class VoiceStoreError(ValueError):
    """A voice that cannot be stored as asked: a bad name (HTTP 400)."""

    status = 400


class VoiceExists(VoiceStoreError):
    """The name is taken, or was taken by a request that won a race (HTTP 409)."""

    status = 409


class VoiceStorageError(VoiceStoreError):
    """The disk is full or read-only: nothing was stored, nothing half-written (HTTP 507)."""

    status = 507


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
    """The voices of one pipeline and model, kept under ``root`` (held open as ``fd``)."""

    def __init__(self, root: Path, fd: int, pipeline: str, model: str):
        self.root, self.fd, self.pipeline, self.model = root, fd, pipeline, model
        self.voices: dict[str, Voice] = {}
        self.problems: list[tuple[str, str]] = []  # (entry, why it was skipped): no paths
        weakref.finalize(self, os.close, fd)

    @classmethod
    def open(cls, root: str | os.PathLike[str], pipeline: str, model: str) -> VoiceStore:
        """The store at ``root`` (created 0700 if missing); ConfigError if it is unsafe."""
        path = Path(root).expanduser()
        store = cls(path, _open_root(path), pipeline, model)
        store._load()
        return store

    # -- start-up ------------------------------------------------------------------

    def _load(self) -> None:
        with os.scandir(self.fd) as entries:
            names = sorted(entry.name for entry in entries)
        for name in names:
            if name.startswith((".tmp-", ".trash-")):
                self._remove_leftover(name)
            elif not name.startswith("."):
                self._load_entry(name)

    def _remove_leftover(self, name: str) -> None:
        """An interrupted write or delete: removed, a link as a link (its target untouched)."""
        try:
            _remove_tree(self.fd, name)
        except OSError as exc:
            log.warning("voices: could not remove %s/%s: %s", self.root, name, exc)

    def _load_entry(self, name: str) -> None:
        try:
            voice = self._read(name)
        except _Skipped as exc:
            self._problem(name, str(exc))
            return
        except Exception as exc:  # any unreadable entry is skipped, never fatal
            self._problem(name, f"unreadable ({type(exc).__name__}: {exc})")
            return
        if (voice.pipeline, voice.model) != (self.pipeline, self.model):
            self._problem(
                name,
                f"enrolled for {voice.pipeline} {voice.model!r}, not this server's "
                f"{self.pipeline} {self.model!r}; upload it again here",
            )
            return
        self.voices[voice.name] = voice

    def _problem(self, name: str, why: str) -> None:
        why = why.replace(str(self.root), "<voices_dir>")  # clients never see host paths
        self.problems.append((name, why))
        log.warning("voices: skipped %s/%s: %s", self.root, name, why)

    def _read(self, name: str) -> Voice:
        import numpy as np

        fd = _open_entry(self.fd, name)
        try:
            meta = json.loads(_read_regular(fd, "voice.json", MAX_META_BYTES).decode("utf-8"))
            prompt_bytes = _read_regular(fd, "prompt.npz", MAX_PROMPT_BYTES)
        finally:
            os.close(fd)
        if meta.get("format") != FORMAT_VERSION or meta.get("name") != name:
            raise ValueError(
                f"voice.json: format {meta.get('format')!r}, name {meta.get('name')!r}"
            )
        with np.load(io.BytesIO(prompt_bytes), allow_pickle=False) as arrays:
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

    # -- changes (the server serializes them per name) ------------------------------

    def check_name(self, name: str) -> None:
        if not NAME.match(name):
            raise VoiceStoreError(
                f"voice name {name!r} must be 1-64 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit"
            )
        if name in self.voices:
            raise VoiceExists(f"voice {name!r} already exists; delete it first")

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
        """Write a voice atomically and make it usable.

        VoiceExists if the name is taken (even by a voice that appeared on
        disk meanwhile: the rename never replaces), VoiceStorageError if the
        disk is full or read-only; either way nothing of it stays on disk.
        """
        self.check_name(name)
        voice = Voice(
            name, self.pipeline, self.model, int(time.time()), duration, transcript, prompt
        )
        files = _voice_files(voice, reference, reference_format)
        staging = f".tmp-{uuid.uuid4().hex}"
        try:
            self._stage(staging, files)
            self._publish(staging, name)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                _remove_tree(self.fd, staging)
            _raise_storage(exc, f"storing voice {name!r}", self.root)
            raise
        _fsync(self.fd)
        self.voices[name] = voice
        return voice

    def _stage(self, staging: str, files: dict[str, bytes]) -> None:
        os.mkdir(staging, 0o700, dir_fd=self.fd)
        fd = _open_entry(self.fd, staging)
        try:
            for filename, data in files.items():
                _write_file(fd, filename, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _publish(self, staging: str, name: str) -> None:
        """Rename ``staging`` to ``name``, refusing to replace anything already there.

        A plain rename would silently replace an empty directory, and fails
        with ENOTEMPTY over a voice: both are a taken name here.
        """
        taken = VoiceExists(
            f"voice {name!r} already exists in the voices directory, though this server "
            "did not load it (see its log); choose another name"
        )
        if _lexists(self.fd, name):
            raise taken
        try:
            os.rename(staging, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise taken from None
            raise

    def delete(self, name: str) -> bool:
        """Remove a voice (False if there is none by that name)."""
        if not NAME.match(name) or name not in self.voices:
            return False
        trash = f".trash-{uuid.uuid4().hex}"
        try:
            os.rename(name, trash, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except FileNotFoundError:
            trash = ""  # removed by hand meanwhile: gone either way
        except OSError as exc:
            _raise_storage(exc, f"deleting voice {name!r}", self.root)
            raise
        del self.voices[name]
        _fsync(self.fd)
        if trash:
            with contextlib.suppress(OSError):  # a leftover is removed at the next start
                _remove_tree(self.fd, trash)
        return True


def _open_root(path: Path) -> int:
    """The voices directory, created if missing, opened only if it is safe (else ConfigError)."""
    _refuse(unsafe_voices_dir(str(path)))
    if not os.path.lexists(path):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # judged below, whatever appeared
            os.mkdir(path, 0o700)
    _refuse(unsafe_voices_dir(str(path)))
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:  # swapped for a link or a file since the check
        raise ConfigError(
            f"voices_dir {path} cannot be opened as a directory ({exc.strerror})",
            hint="set server.voices_dir to a directory of the server's user",
        ) from None
    try:
        _refuse(unsafe_voices_dir(str(path), os.fstat(fd)))  # what was opened is what counts
    except ConfigError:
        os.close(fd)
        raise
    return fd


def _refuse(unsafe: tuple[str, str] | None) -> None:
    if unsafe is not None:
        raise ConfigError(unsafe[0], hint=unsafe[1])


def _voice_files(voice: Voice, reference: bytes, reference_format: str) -> dict[str, bytes]:
    """The files of a voice, in the order they are written (voice.json last)."""
    import numpy as np

    extension = reference_format if EXTENSION.match(reference_format) else "bin"
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in voice.prompt.items()})
    meta = {
        "format": FORMAT_VERSION,
        "name": voice.name,
        "pipeline": voice.pipeline,
        "model": voice.model,
        "created": voice.created,
        "duration": voice.duration,
        "transcript": voice.transcript,
        "consent": True,  # uploads without consent are refused before this
        "reference": f"reference.{extension}",
    }
    return {
        "prompt.npz": buffer.getvalue(),
        f"reference.{extension}": reference,
        "voice.json": json.dumps(meta, indent=1).encode(),
    }


def _raise_storage(exc: BaseException, doing: str, root: Path) -> None:
    """VoiceStorageError for a full or read-only disk (the path only in the log)."""
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        log.error("voices: %s in %s failed: %s", doing, root, exc)
        reason = os.strerror(exc.errno)
        raise VoiceStorageError(
            f"{doing} failed: the voices directory has no room or is read-only ({reason}); "
            "nothing was stored, tell the server's operator"
        ) from None
