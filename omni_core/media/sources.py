"""Reading the bytes a media reference names, as a stage receives it, under a size bound.

The HTTP server checks every reference before a request is admitted
(:mod:`omni_core.serve.chat.media`); what reaches a stage is one of:

- ``data:<type>;base64,<data>``: decoded here, refused unless strictly base64
  and at most ``max_bytes`` (checked before decoding);
- an absolute path or ``file:///absolute/path``: the server has resolved it
  (symlinks followed) inside ``server.media_dirs`` and rewritten the reference
  to the result, which is read here *literally*: a ``file://`` path is not
  percent-decoded (the server writes the resolved path unquoted, and so does
  the Qwen reference code read it), so a name such as ``a%41.png`` is the file
  that was checked, never ``aA.png``. Relative paths are refused. The file
  is opened without blocking (a FIFO swapped in after the check cannot hang
  the stage), must be a regular file, and its size is checked with ``fstat``
  before reading; the read stops at ``max_bytes + 1`` in case it grows.
  Messages do not echo the resolved path: it is the server's, not the
  client's;
- ``http(s)://``: fetched by :func:`~omni_core.media.remote.fetch_remote_media`
  (public addresses only, no redirects, ``max_bytes`` and ``timeout``), and
  only when :attr:`MediaFetch.allow_remote` is set.

``input_audio.data`` (plain base64, no ``data:`` prefix) is read with
:func:`read_base64`.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from dataclasses import dataclass
from typing import BinaryIO

from .errors import MediaError
from .remote import SCHEMES as REMOTE_SCHEMES
from .remote import fetch_remote_media

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
)


@dataclass(frozen=True)
class MediaFetch:
    """How a stage may read media references: what to fetch, how much, how long."""

    allow_remote: bool = False  # server.allow_remote_media
    max_bytes: int = 32 * 1024 * 1024  # the raw bytes, whatever the form
    timeout: float = 30.0  # remote fetches: server.remote_media_timeout
    allow_loopback: bool = False  # tests that fetch from 127.0.0.1 only; no setting reaches it

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or not self.timeout > 0:
            raise ValueError(f"need max_bytes >= 1 and timeout > 0, got {self}")


async def read_media(value: str, field: str, fetch: MediaFetch) -> tuple[bytes, str | None]:
    """The bytes ``value`` names and the media type its ``data:`` URL declares (else None).

    Local files and base64 are read in a worker thread, remote media on the
    event loop. Raises :class:`MediaError` naming ``field`` for anything refused.
    """
    scheme = _scheme(value, field)
    if scheme in REMOTE_SCHEMES:
        return await _fetch_remote(value, field, fetch), None
    import anyio

    return await anyio.to_thread.run_sync(_read_here, value, field, fetch.max_bytes, scheme)


def read_media_sync(value: str, field: str, fetch: MediaFetch) -> tuple[bytes, str | None]:
    """:func:`read_media` for a worker thread (a remote fetch runs its own event loop there).

    Not for an event loop's own thread: that one must ``await read_media``.
    """
    scheme = _scheme(value, field)
    if scheme in REMOTE_SCHEMES:
        import anyio

        return anyio.run(_fetch_remote, value, field, fetch), None
    return _read_here(value, field, fetch.max_bytes, scheme)


def read_base64(text: str, field: str, max_bytes: int) -> bytes:
    """Strict base64 ``text`` decoded, refused before decoding if over ``max_bytes``."""
    if not isinstance(text, str):
        raise MediaError(field, f"{field}: expected base64 text, got {type(text).__name__}")
    if not text:
        raise MediaError(field, f"{field}: is empty; expected base64 data")
    if len(text) % 4:
        raise MediaError(field, _not_base64(field))
    size = len(text) // 4 * 3 - text[-2:].count("=")
    if size > max_bytes:
        raise MediaError(field, f"{field}: holds {size} bytes; the limit is {max_bytes} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII text
        raise MediaError(field, _not_base64(field)) from None


def read_data_url(value: str, field: str, max_bytes: int) -> tuple[bytes, str | None]:
    """The bytes of a ``data:[<type>][;…];base64,<data>`` URL and its media type, if given."""
    head, comma, payload = value[len("data:") :].partition(",")
    if not value[:5].lower() == "data:" or not comma:
        raise MediaError(field, f"{field}: a data: URL needs a ',' before its data")
    params = [p.strip().lower() for p in head.split(";")]
    if params[-1] != "base64":
        raise MediaError(field, f"{field}: data: URLs must be base64, e.g. data:image/png;base64,…")
    mediatype = params[0] if len(params) > 1 and params[0] else None
    return read_base64(payload, field, max_bytes), mediatype


def read_local_file(path: str, field: str, max_bytes: int) -> bytes:
    """The regular file at the absolute ``path``, refused if over ``max_bytes``."""
    if not path or "\0" in path or not os.path.isabs(path):
        raise MediaError(
            field,
            f"{field}: a local media path must be absolute (the server resolves paths under "
            "server.media_dirs before a stage reads them)",
        )
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise MediaError(field, f"{field}: the local file no longer exists") from None
    except OSError as exc:
        raise MediaError(
            field, f"{field}: the local file cannot be opened: {exc.strerror or exc}"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MediaError(field, f"{field}: the local path is not a regular file")
        if info.st_size > max_bytes:
            raise MediaError(field, _too_large(field, info.st_size, max_bytes))
        file = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    with file:
        try:
            data = _read_at_most(file, max_bytes + 1)
        except OSError as exc:
            raise MediaError(
                field, f"{field}: the local file cannot be read: {exc.strerror or exc}"
            ) from None
    if len(data) > max_bytes:
        raise MediaError(field, _too_large(field, None, max_bytes))
    return data


def _read_here(value: str, field: str, max_bytes: int, scheme: str) -> tuple[bytes, str | None]:
    if scheme == "data":
        return read_data_url(value, field, max_bytes)
    if scheme == "file":
        if not value[len("file://") :].startswith("/") or value[5:7] != "//":
            raise MediaError(field, f"{field}: a file: URL must be file:///absolute/path (no host)")
        return read_local_file(value[len("file://") :], field, max_bytes), None
    if scheme and len(scheme) > 1:
        raise MediaError(
            field,
            f"{field}: unsupported URL scheme {scheme!r}; expected data:, file://, http(s):// "
            "or an absolute path",
        )
    return read_local_file(value, field, max_bytes), None


async def _fetch_remote(value: str, field: str, fetch: MediaFetch) -> bytes:
    if not fetch.allow_remote:
        raise MediaError(
            field,
            f"{field}: this server does not fetch remote media; send it inline "
            "(a data: URL with base64)",
            hint="the operator can set server.allow_remote_media",
        )
    return await fetch_remote_media(
        value,
        field,
        max_bytes=fetch.max_bytes,
        timeout=fetch.timeout,
        allow_loopback=fetch.allow_loopback,
    )


def _scheme(value: str, field: str) -> str:
    if not isinstance(value, str):
        raise MediaError(field, f"{field}: expected a URL or path, got {type(value).__name__}")
    match = _SCHEME.match(value)
    return match.group(1).lower() if match else ""


def _read_at_most(file: BinaryIO, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = file.read(min(limit - total, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _not_base64(field: str) -> str:
    return (
        f"{field}: is not base64 (standard alphabet A-Z a-z 0-9 + /, padded with =, "
        "no spaces or line breaks)"
    )


def _too_large(field: str, size: int | None, max_bytes: int) -> str:
    found = f"is {size} bytes" if size is not None else "grew while being read"
    return f"{field}: the local file {found}; the limit is {max_bytes} bytes"
