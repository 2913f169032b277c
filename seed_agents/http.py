"""One retry policy for every HTTP client that talks to a model server.

The vLLM backend (sync and async requests, stream openings) and the OpenAI-compatible
analyzer share this one, built on tenacity, so every client retries the same way:

- retried: connection errors and timeouts (``httpx.TransportError``), and the answers
  ``408``, ``429`` and ``5xx`` (``retryable_status``); a client raises ``RetryableResponse``
  for those. Any other ``4xx`` is the caller's mistake and is never retried.
- waits: exponential backoff with full jitter (tenacity's ``wait_random_exponential``: a
  random wait up to ``backoff_s * 2**k``, capped at ``max_backoff_s``), so many clients
  that failed together do not retry together; a ``Retry-After`` header (seconds or an HTTP
  date) wins over the backoff, capped at ``max_backoff_s`` as well.
- at most ``max_retries`` retries; the last exception is re-raised as it was, so each
  client keeps its own error lines (the backend's ``BackendUnavailable`` and circuit
  breaker, the analyzer's error reply).

``tools.openapi`` keeps its own stop rules (a deadline, a Retry-After too long to wait
ends the retries, writes retried on fewer statuses) and shares ``retry_after_seconds``.

``run_blocking`` gives sync code a total deadline on an HTTP exchange: httpx's timeouts
apply to each read, so a server that sends a byte a second holds a sync request for ever
(encode/httpx#1450); only cancellation (``anyio.fail_after``) bounds a whole exchange, and
cancellation needs an event loop. ``tls_context`` is httpx's default TLS context made once,
for clients made per call (loading the CA bundle costs tens of milliseconds each time).
``bounded_encoding`` tells a body httpx can decode without a memory bomb from one it cannot.
"""

from __future__ import annotations

import email.utils
import math
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

import httpx
from anyio.from_thread import BlockingPortalProvider
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 429})
"""Retried besides every 5xx: a request timeout and a rate limit."""


def retryable_status(status: int) -> bool:
    """408, 429 and 5xx are worth another try; every other status is final."""
    return status in RETRY_STATUSES or status >= 500


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or an HTTP date); None if absent or unparsable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None  # "inf", "1e400": no usable wait
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class RetryableResponse(Exception):
    """An answer worth retrying (``retryable_status``), kept so the final error can quote
    the server; ``retry_after`` is the server's Retry-After in seconds, if it sent one."""

    def __init__(self, status_code: int, message: str, retry_after: float | None = None) -> None:
        self.status_code = status_code
        self.message = message
        self.retry_after = retry_after
        super().__init__(f"HTTP {status_code}: {message}")

    @classmethod
    def of(cls, response: httpx.Response, message: str) -> RetryableResponse:
        return cls(response.status_code, message, retry_after_seconds(response.headers.get("retry-after")))


def is_retryable(error: BaseException) -> bool:
    """Connection errors, timeouts and retryable answers."""
    return isinstance(error, httpx.TransportError | RetryableResponse)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry; ``retrying``/``aretrying`` run a call under it."""

    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def wait(self, state: RetryCallState) -> float:
        """Retry-After when the server sent one, else jittered exponential backoff; both capped."""
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, RetryableResponse) and error.retry_after is not None:
            return min(error.retry_after, self.max_backoff_s)
        return wait_random_exponential(multiplier=self.backoff_s, max=self.max_backoff_s)(state)

    def _options(self, retry_on: Callable[[BaseException], bool]) -> dict[str, Any]:
        return {"retry": retry_if_exception(retry_on), "stop": stop_after_attempt(self.max_retries + 1),
                "wait": self.wait, "reraise": True}

    def retrying(self, retry_on: Callable[[BaseException], bool] = is_retryable, **options: Any) -> Retrying:
        """A tenacity ``Retrying``: ``policy.retrying()(fn, *args)``. ``options`` go to
        tenacity (e.g. ``sleep`` in tests)."""
        return Retrying(**self._options(retry_on), **options)

    def aretrying(self, retry_on: Callable[[BaseException], bool] = is_retryable, **options: Any) -> AsyncRetrying:
        """The async twin: ``await policy.aretrying()(coro_fn, *args)``."""
        return AsyncRetrying(**self._options(retry_on), **options)


def bounded_encoding(content_encoding: str | None) -> bool:
    """True when a body so encoded grows by a bounded factor as httpx decodes it: not at
    all, or one gzip/deflate layer (at most ~1000x a network read). zstd and br can turn a
    few KB into GBs in one decoding step, and so can gzip twice: a client that caps what it
    reads asks for ``Accept-Encoding: identity`` and refuses those before reading the body."""
    layers = [e.strip().lower() for e in (content_encoding or "").split(",") if e.strip().lower() not in ("", "identity")]
    return len(layers) <= 1 and set(layers) <= {"gzip", "x-gzip", "deflate"}


_PORTAL = BlockingPortalProvider()  # one event-loop thread, started while any sync caller needs it


def run_blocking(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await fn(*args)`` from sync code (any thread, even one whose own loop is running),
    on a shared event-loop thread; exceptions and context variables carry across. For sync
    callers that must bound a whole exchange with ``anyio.fail_after`` (see the module)."""
    with _PORTAL as portal:
        return portal.call(fn, *args)


@cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi, or SSL_CERT_FILE / SSL_CERT_DIR as set at first
    use), made once and shared: ``httpx.AsyncClient(verify=tls_context())``."""
    return httpx.create_ssl_context()
