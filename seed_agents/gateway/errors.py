"""OpenAI-style errors: every refusal is ``{"error": {"message", "type", "code"}}``.

OpenAI clients (the ``openai`` SDK, LangChain) read this shape into their own exception
types, so a user sees the gateway's message rather than a bare status code.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse


class GatewayError(Exception):
    """A request the gateway refuses or cannot serve; becomes one OpenAI-style JSON reply."""

    def __init__(self, status: int, message: str, *, type: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, code: str = "invalid_request") -> GatewayError:
    return GatewayError(400, message, type="invalid_request_error", code=code)


def not_found(message: str, code: str) -> GatewayError:
    return GatewayError(404, message, type="invalid_request_error", code=code)
