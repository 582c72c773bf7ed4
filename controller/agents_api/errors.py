"""Refusals in the API's error shape: ``{"error": {"message", "type", "param", "code"}}`` with the
HTTP status, as the hosted API answers (the openai client raises its ``APIStatusError`` subclass for
the status and keeps this body)."""

from __future__ import annotations

from typing import Any

from controller.model.errors import DesktopSandboxError
from controller.text import clean

TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
         405: "invalid_request_error", 409: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
         422: "invalid_request_error", 500: "server_error", 502: "server_error", 503: "server_error"}


class ApiError(DesktopSandboxError):
    """A refusal: ``status`` (HTTP), ``code`` (machine-readable), ``message`` (one line, escaped here),
    ``param`` (the request field at fault, or None)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code
        self.message = clean(message, 1000)
        self.param = None if param is None else clean(param, 200)

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def unsupported(what: str, param: str | None = None) -> ApiError:
    """400 ``unsupported``: ``what`` is outside the subset this server serves."""
    return ApiError(400, "unsupported", f"not supported by this server: {what}", param)


def invalid(message: str, param: str | None = None) -> ApiError:
    """400 ``invalid_request``."""
    return ApiError(400, "invalid_request", message, param)
