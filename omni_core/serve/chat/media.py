"""Media references in chat messages: what a client may point the server at.

A message may carry media inline (``data:`` URLs, ``input_audio``), by local
path (``/x.wav``, ``file:///x.wav``) or by remote URL (``http(s)://``). The
last two make the server read on the client's behalf, so:

- local paths are refused unless they resolve (symlinks followed) inside a
  directory of ``server.media_dirs``; a path that cannot name a file (a NUL
  byte, …) is refused as such. Allowed paths reach the stage resolved, so it
  reads exactly the file that was checked;
- remote URLs are refused unless ``server.allow_remote_media`` is set, and then
  only to public addresses (:mod:`omni_core.media.remote`); the fetch checks
  again when it connects;
- ``data:`` URLs must say ``;base64`` and hold valid base64 (the body limit
  bounds their size).

Shapes (which keys, strings where strings are meant) are checked first, in
:mod:`.content`. Every refusal is a 400 whose ``param`` names the field.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ...media.errors import MediaError
from ...media.remote import SCHEMES as REMOTE_SCHEMES
from ...media.remote import check_remote_url
from ..common.errors import APIError
from .content import Reference, check_base64, media_references

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


@dataclass(frozen=True)
class MediaPolicy:
    """What the operator allows clients to reference (from ``server.*``)."""

    media_dirs: tuple[str, ...] = ()
    allow_remote: bool = False
    remote_timeout: float = 30.0

    @classmethod
    def of(cls, server: Any) -> MediaPolicy:
        return cls(
            media_dirs=tuple(server.media_dirs),
            allow_remote=server.allow_remote_media,
            remote_timeout=server.remote_media_timeout,
        )


async def check_media(messages: list[dict[str, Any]], policy: MediaPolicy) -> None:
    """Check every content part and media reference in ``messages``; resolve paths in place."""
    roots = [os.path.realpath(d) for d in policy.media_dirs]
    for ref in media_references(messages):
        match = _SCHEME.match(ref.value)
        scheme = match.group(1).lower() if match else ""
        if scheme == "data":
            _check_data_url(ref)
        elif scheme in REMOTE_SCHEMES:
            await _check_remote(ref, policy)
        else:
            ref.replace(_checked_path(ref, scheme, roots, policy.media_dirs))


def _check_data_url(ref: Reference) -> None:
    head, comma, payload = ref.value[len("data:") :].partition(",")
    if not comma:
        raise APIError(
            400, f"{ref.where}: a data: URL needs a ',' before its data", param=ref.where
        )
    params = [p.strip().lower() for p in head.split(";")]
    if params[-1] != "base64":
        raise APIError(
            400,
            f"{ref.where}: data: URLs must be base64, e.g. data:{ref.kind}/...;base64,AAAA",
            param=ref.where,
        )
    mediatype = params[0] if len(params) > 1 else ""
    if (
        mediatype
        and mediatype.split("/")[0] != ref.kind
        and mediatype != "application/octet-stream"
    ):
        raise APIError(
            400,
            f"{ref.where}: this {ref.kind} part holds {mediatype!r} data; "
            f"send {ref.kind}/* (or leave the media type out)",
            param=ref.where,
        )
    check_base64(payload, ref.where)


async def _check_remote(ref: Reference, policy: MediaPolicy) -> None:
    import anyio

    if not policy.allow_remote:
        raise APIError(
            400,
            f"{ref.where}: this server does not fetch remote media; send the {ref.kind} inline "
            "(a data: URL with base64) or ask the operator to set server.allow_remote_media",
            param=ref.where,
        )
    try:
        with anyio.fail_after(policy.remote_timeout):
            await check_remote_url(ref.value, ref.where)
    except TimeoutError:
        raise APIError(
            400,
            f"{ref.where}: the host of {ref.value!r} did not resolve within "
            f"{policy.remote_timeout:g} s",
            param=ref.where,
        ) from None
    except MediaError as exc:
        raise APIError(400, exc.message, param=ref.where) from None


def _checked_path(
    ref: Reference, scheme: str, roots: list[str], media_dirs: tuple[str, ...]
) -> str:
    where, reference = ref.where, ref.value
    if scheme == "file":
        try:
            parts = urlsplit(reference)
        except ValueError as exc:
            raise APIError(400, f"{where}: not a valid file: URL: {exc}", param=where) from None
        if parts.netloc not in ("", "localhost"):
            raise APIError(
                400,
                f"{where}: file: URLs name no host (file:///path), got {parts.netloc!r}",
                param=where,
            )
        path, as_url = unquote(parts.path), True
    elif len(scheme) > 1:  # (a one-letter "scheme" is a Windows drive)
        raise APIError(
            400,
            f"{where}: unsupported URL scheme {scheme!r}; use data:, "
            "http(s):// or a local path under the server's media directories",
            param=where,
        )
    else:
        path, as_url = reference, False
    if not path or "\0" in path:
        problem = "is empty" if not path else "contains a NUL byte"
        raise APIError(400, f"{where}: the path {problem}", param=where)
    try:
        real = os.path.realpath(path)
        inside = any(os.path.commonpath([real, root]) == root for root in roots)
        is_file = inside and os.path.isfile(real)
    except (OSError, ValueError) as exc:
        raise APIError(400, f"{where}: {path!r} is not a usable path: {exc}", param=where) from None
    if not inside:
        allowed = ", ".join(media_dirs) if media_dirs else "none are configured"
        raise APIError(
            400,
            f"{where}: local media path {path!r} is not allowed; the server reads local files "
            f"only from the directories in server.media_dirs ({allowed})",
            param=where,
        )
    if not is_file:
        raise APIError(400, f"{where}: no such file: {path!r}", param=where)
    return f"file://{real}" if as_url else real
