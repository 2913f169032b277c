"""Admission under load: a full gateway says "retry later" instead of dropping connections.

Beyond ``max_in_flight`` requests in progress (streams count until their last byte), a new
request is answered at once with 503, ``Retry-After`` and an OpenAI-style error body, which
the OpenAI SDK and LangChain retry on their own. Without the bound, a burst queues every
request inside the process: latencies grow until clients time out and close their
connections, and uvicorn's own ``limit_concurrency`` answers a bare text 503 with no
``Retry-After``. ``/health`` is never refused, so a busy gateway is not taken for a dead one.
A refused request never reaches a route, so it stores nothing.

This is a pure ASGI middleware (no ``BaseHTTPMiddleware``): it wraps the whole response,
streamed bodies included, and adds no task per request.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

OVERLOADED_BODY = json.dumps({"error": {
    "message": "the gateway has too many requests in flight; retry after the Retry-After delay",
    "type": "server_error", "code": "overloaded"}}).encode()
EXEMPT_PATHS = frozenset({"/health"})


class InFlightLimit:
    """Answer 503 + ``Retry-After`` while ``limit`` HTTP requests are already in progress."""

    def __init__(self, app: ASGIApp, limit: int, retry_after_s: int = 1, stats: Counter[str] | None = None) -> None:
        self.app = app
        self.limit = limit
        self.retry_after = str(retry_after_s).encode()
        self.stats = stats if stats is not None else Counter()
        self.in_flight = 0  # one event loop: no lock needed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self.stats["http_503_overloaded"] += 1
            await _refuse(send, self.retry_after)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def _refuse(send: Send, retry_after: bytes) -> None:
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(OVERLOADED_BODY)).encode()),
                          (b"retry-after", retry_after)]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": OVERLOADED_BODY})
