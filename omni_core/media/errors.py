"""The one error type of bad client media, naming the field it came from."""

from __future__ import annotations

from ..errors import RequestError


class MediaError(RequestError):
    """Client-supplied media was refused; ``field`` names where it was in the request.

    A :class:`~omni_core.errors.RequestError`, so that a stage raising it answers
    HTTP 400; the server maps ``field`` to the OpenAI error's ``param``.
    """

    def __init__(self, field: str, message: str, *, hint: str | None = None):
        self.field = field
        super().__init__(message, hint=hint)
