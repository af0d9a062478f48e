"""Local media paths in chat messages: allowed only under the operator's ``server.media_dirs``.

A chat message may point at media by URL (``data:``, ``http(s)://``) or by
local path (``file:///x.wav`` or ``/x.wav``). A local path lets a client make
the server read any file it can, so it is refused unless it resolves
(symlinks followed) inside a directory the operator listed. Allowed paths
reach the stage resolved, so the stage reads exactly the file that was checked.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

from .errors import APIError

REMOTE_SCHEMES = ("http", "https", "data")


def check_media(messages: list[dict[str, Any]], media_dirs: list[str]) -> None:
    """Check (and resolve in place) every local media reference in ``messages``."""
    roots = [os.path.realpath(d) for d in media_dirs]
    for m_index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for p_index, part in enumerate(content):
            kind = part.get("type")
            value = part.get(kind)
            where = f"messages.{m_index}.content.{p_index}.{kind}"
            if isinstance(value, dict) and isinstance(value.get("url"), str):
                value["url"] = _checked(value["url"], roots, media_dirs, f"{where}.url")
            elif isinstance(value, str) and kind != "text":
                part[kind] = _checked(value, roots, media_dirs, where)


def _checked(reference: str, roots: list[str], media_dirs: list[str], where: str) -> str:
    parts = urlsplit(reference)
    if parts.scheme in REMOTE_SCHEMES:
        return reference
    if parts.scheme == "file":
        path, as_url = unquote(parts.path), True
    elif parts.scheme and len(parts.scheme) > 1:  # (a one-letter "scheme" is a Windows drive)
        raise APIError(
            400,
            f"{where}: unsupported URL scheme {parts.scheme!r}; use data:, "
            "http(s):// or a local path under the server's media directories",
            param=where,
        )
    else:
        path, as_url = reference, False
    real = os.path.realpath(path)
    if not any(os.path.commonpath([real, root]) == root for root in roots):
        allowed = ", ".join(media_dirs) if media_dirs else "none are configured"
        raise APIError(
            400,
            f"{where}: local media path {path!r} is not allowed; the server reads local files "
            f"only from the directories in server.media_dirs ({allowed})",
            param=where,
        )
    if not os.path.isfile(real):
        raise APIError(400, f"{where}: no such file: {path!r}", param=where)
    return f"file://{real}" if as_url else real
