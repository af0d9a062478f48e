"""API errors in OpenAI's shape, so that the official clients raise the right exception.

``{"error": {"message", "type", "param", "code"}}`` with the HTTP status is
what ``openai`` turns into ``BadRequestError``, ``AuthenticationError``,
``RateLimitError`` …, carrying our message verbatim.
"""

from __future__ import annotations

from typing import Any

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    """An error answered to the client with ``status`` and a message it can act on."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": TYPES.get(
                    self.status, "server_error" if self.status >= 500 else "invalid_request_error"
                ),
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(error: APIError) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
