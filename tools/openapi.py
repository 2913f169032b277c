"""LangChain tools generated from a deployed HTTP API's OpenAPI 3 spec.

A tool call is untrusted input (the model writes the arguments) aimed at a production
system, so every guard sits below the model's reach and fails closed:

- Where requests go: the base URL's host must be in ``allow_hosts`` when the tools are
  built, and every request, each redirect hop included, is checked again against the
  hosts and against the allowed operations' method and path templates.
- What may be called: only operations in ``allow_operations`` become tools.
- Credentials: ``AuthConfig`` names an environment variable. Its value is read when a
  request is sent, set on that request only, and redacted from everything a tool returns
  or logs; the tool objects (repr, args, schema, metadata) never hold it.
- Failures: an HTTP error, a timeout, a refused host or operation, an oversized response
  or invalid arguments all come back as the tool's result: a short message the model can
  act on, in a ToolMessage with status "error". Nothing raises out of the graph except an
  ``EpisodeSignal`` that a transport raises on purpose (``tools.replay.Unreplayable``).
- Time: ``timeout_s`` bounds a whole attempt, connect to last byte, and ``deadline_s`` the
  whole call, retries and waits included. httpx's own timeouts apply per read, so a server
  that drips a byte a second would hold a call for ever (encode/httpx#1450); the attempt
  therefore runs under ``anyio.fail_after``, and a sync tool on the real network runs its
  request on that async engine (``seed_agents.http.run_blocking``). A transport passed in is
  in-process code that answers for itself (its body is still cut at the deadline).
- What comes back: at most ``max_response_bytes`` of the body (the rest is never read), as
  text; a body that is not text becomes a one-line note, not mojibake. Responses are asked
  for uncompressed; one gzip or deflate layer is still read, but an encoding that can grow
  a few KB into GBs in one step (zstd, br, gzip twice) is refused before its body is read.
- State: none. Cookies the API sets are neither kept nor sent back, not even to a redirect
  or a retry of the same call (a cookie set by a 429 would otherwise ride on its retry).

Retries use tenacity: 429/502/503/504 and connection failures, honouring Retry-After up
to a cap (a longer wait is not retried: the model is told to come back later), otherwise
jittered exponential backoff. A mutating operation is retried only where the server
cannot have acted on it (429, 503, no connection): after a 502 or 504 a POST may already
have borrowed the book.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import anyio
import httpx
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import to_jsonable_python
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_any,
    stop_before_delay,
    wait_random_exponential,
)

from seed_agents.faults import EpisodeFault
from seed_agents.http import bounded_encoding, retry_after_seconds, run_blocking, tls_context
from seed_agents.redact import redact
from seed_agents.tools.openapi_auth import AuthConfig, EnvAuth
from seed_agents.tools.openapi_auth import Refused as _Refused

# the spec side, named here too: `from seed_agents.tools.openapi import load_spec` is the public path
from seed_agents.tools.openapi_spec import (  # noqa: F401
    HTTP_METHODS,
    READ_ONLY_METHODS,
    Operation,
    Param,
    SpecError,
    Transport,
    load_spec,
    operations,
)

log = logging.getLogger("seed_agents.tools.openapi")

RETRY_STATUS_READ = frozenset({429, 502, 503, 504})
RETRY_STATUS_WRITE = frozenset({429, 503})  # the server did not act on the request
_RETRY_EXCEPTIONS = (httpx.ConnectError, httpx.ConnectTimeout)  # nothing was sent


class EpisodeSignal(EpisodeFault):
    """Not a tool failure: raised by a transport to end the episode (``Unreplayable``), an
    infrastructure fault the runner records and never trains on. Tools let it through;
    everything else becomes the tool's error message."""


class OpenAPIToolsConfig(BaseModel):
    """How tools reach one API. Every field is documented; YAML configs validate against it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(description="The API's base URL (http or https); operation paths are appended to it.")
    allow_hosts: tuple[str, ...] = Field(min_length=1, description="Hostnames requests may go to; the base URL's host must be one.")
    allow_operations: tuple[str, ...] | None = Field(None, description="operationIds that become tools (default: all).")
    safe_operations: tuple[str, ...] = Field((), description="operationIds that are read-only although their method is not GET/HEAD/OPTIONS.")
    auth: AuthConfig | None = Field(None, description="Credentials from an environment variable (none: no auth header).")
    timeout_s: float = Field(10.0, gt=0, description="Total time of one attempt, from connecting to the last byte read "
                                                     "(not per read: a server dripping bytes is cut off at it).")
    max_retries: int = Field(3, ge=0, le=10, description="Retries after the first attempt on 429/5xx/connection failures.")
    deadline_s: float = Field(60.0, gt=0, description="Total time of one call, retries and waits included: a retry "
                                                      "starts only if its wait and a whole attempt fit before it.")
    max_retry_after_s: float = Field(30.0, ge=0, description="Longest Retry-After honoured; a longer one ends the retries.")
    backoff_s: float = Field(0.5, gt=0, description="Base of the jittered exponential backoff (no Retry-After).")
    backoff_max_s: float = Field(8.0, gt=0, description="Longest single backoff wait.")
    max_response_bytes: int = Field(32_768, ge=256, description="Most bytes of a response body read and shown to the model; "
                                                                "the rest is not read (cut or refused, see oversize).")
    oversize: Literal["truncate", "error"] = Field("truncate", description="truncate: return the first bytes with a marker; error: a tool error.")
    max_error_chars: int = Field(400, ge=80, description="Length cap of an error message shown to the model.")
    max_redirects: int = Field(5, ge=0, description="Redirect hops followed (each one re-checked against the allowlists).")

    @model_validator(mode="after")
    def _base_url_allowed(self) -> OpenAPIToolsConfig:
        url = httpx.URL(self.base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"base_url must be an http(s) URL with a host, got {self.base_url!r}")
        if url.host.lower() not in {h.lower() for h in self.allow_hosts}:
            raise ValueError(f"base_url host {url.host!r} is not in allow_hosts {list(self.allow_hosts)}")
        return self


# ------------------------------------------------------------------------------ calling


@dataclass(frozen=True)
class _Reply:
    """One attempt's outcome, read and closed (so tenacity can hold it between attempts)."""

    status: int
    reason: str
    headers: httpx.Headers
    body: bytes
    truncated: bool
    charset: str | None

    def text(self) -> str | None:
        """The body as text in its declared charset (else UTF-8), a character cut by the size
        cap dropped; a text content type that does not decode gets replacement characters.
        None for a body that is not text (an image, a zip)."""
        charset = self.charset or "utf-8"
        try:
            try:
                return self.body.decode(charset)
            except UnicodeDecodeError as e:
                if self.truncated and e.start >= len(self.body) - 8:
                    return self.body[:e.start].decode(charset)
                raise
        except (ValueError, LookupError):  # UnicodeError, or a charset that is no text encoding ("base64")
            content_type = self.headers.get("content-type", "").lower()
            textual = content_type.startswith("text/") or any(k in content_type for k in ("json", "xml", "yaml", "javascript"))
            return self.body.decode("utf-8", errors="replace") if textual else None


@dataclass(frozen=True)
class _Request:
    method: str
    url: str
    params: list[tuple[str, str]]
    json: Any
    has_body: bool


class _Caller:
    """Sends the requests of the tools built by one ``openapi_tools`` call."""

    def __init__(self, config: OpenAPIToolsConfig, ops: Sequence[Operation], transport: Transport | None) -> None:
        self.config = config
        self._hosts = {h.lower() for h in config.allow_hosts}
        self._scheme = httpx.URL(config.base_url).scheme
        self._origin = _origin(httpx.URL(config.base_url))
        base_path = httpx.URL(config.base_url).path.rstrip("/")
        self._routes = [(o.method, route_regex(base_path + o.path)) for o in ops]
        self._transport = transport

    def __repr__(self) -> str:
        return f"_Caller(base_url={self.config.base_url!r})"

    # -- the tool functions

    def function(self, op: Operation) -> Callable[..., str]:
        """``op``'s tool function: a closure with the signature ``(**args)`` LangChain calls."""
        def call(**args: Any) -> str:
            return self.run(op, **args)
        return call

    def coroutine(self, op: Operation) -> Callable[..., Any]:
        async def call(**args: Any) -> str:
            return await self.arun(op, **args)
        return call

    def invalid_args(self, op: Operation) -> Callable[[ValidationError], str]:
        """The tool result for arguments that fail the schema: what to fix, per field."""
        def message(error: ValidationError) -> str:
            problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'arguments'}: {e['msg']}"
                                 for e in error.errors(include_url=False))
            return self.redact(f"Error: invalid arguments for {op.tool_name}: {problems}. Fix them and call again.")
        return message

    # positional-only ``op``: an API argument may itself be called 'op' or 'self'

    def run(self, op: Operation, /, **args: Any) -> str:
        if self._transport is None:  # a real socket: only the async engine can cut a whole attempt off (module doc)
            return run_blocking(partial(self.arun, op, **args))
        try:
            request = self._request(op, args)
            deadline = time.monotonic() + self.config.deadline_s
            with self._client() as client:
                reply = Retrying(**self._retry_policy(op))(self._attempt, client, request, deadline)
            return self._result(op, reply)
        except (EpisodeSignal, ToolException):
            raise
        except Exception as e:  # noqa: BLE001 -- the tool boundary: nothing else may escape into the graph
            raise ToolException(self._message(op, e)) from None

    async def arun(self, op: Operation, /, **args: Any) -> str:
        try:
            request = self._request(op, args)
            deadline = time.monotonic() + self.config.deadline_s
            async with self._async_client() as client:
                reply = await AsyncRetrying(**self._retry_policy(op))(self._async_attempt, client, request, deadline)
            return self._result(op, reply)
        except (EpisodeSignal, ToolException):
            raise
        except Exception as e:  # noqa: BLE001 -- the tool boundary, as in run()
            raise ToolException(self._message(op, e)) from None

    # -- one request

    def _request(self, op: Operation, args: dict[str, Any]) -> _Request:
        path, query, body, whole, has_body = op.path, [], {}, None, False
        for p in op.params:
            value = args.get(p.field)
            if value is None:
                continue
            if p.location == "path":
                path = path.replace("{" + p.name + "}", _path_segment(value))
            elif p.location == "query":
                query += [(p.name, _scalar(v)) for v in (value if isinstance(value, list) else [value])]
            elif p.location == "body":
                body[p.name], has_body = value, True
            else:
                whole, has_body = value, True
        payload = to_jsonable_python(whole if any(p.location == "whole_body" for p in op.params) else body,
                                     by_alias=True, exclude_none=True)
        return _Request(op.method, self.config.base_url.rstrip("/") + path, query, payload, has_body)

    # Redirects are followed here, not by httpx: httpx reads (and decodes) a redirect's whole
    # body before the next hop, however large or compressed; here it is never read.

    def _attempt(self, client: httpx.Client, req: _Request, deadline: float) -> _Reply:
        """One attempt on a sync transport of the caller's (in-process: it answers for itself);
        its body is still read no longer than the attempt's time."""
        ends = time.monotonic() + self._budget(deadline)
        request = client.build_request(req.method, req.url, params=req.params, json=req.json if req.has_body else None)
        for _ in range(self.config.max_redirects + 1):
            response = client.send(request, stream=True)
            try:
                if response.next_request is None:
                    self._check_head(response)
                    data = bytearray()
                    for chunk in response.iter_bytes():
                        data += chunk
                        if len(data) > self.config.max_response_bytes:
                            break
                        if time.monotonic() > ends:
                            raise TimeoutError
                    return self._reply(response, bytes(data))
                request = response.next_request
            finally:
                response.close()
        raise httpx.TooManyRedirects("too many redirects", request=request)

    async def _async_attempt(self, client: httpx.AsyncClient, req: _Request, deadline: float) -> _Reply:
        with anyio.fail_after(self._budget(deadline)):  # the whole attempt, however slowly the bytes come
            request = client.build_request(req.method, req.url, params=req.params, json=req.json if req.has_body else None)
            for _ in range(self.config.max_redirects + 1):
                response = await client.send(request, stream=True)
                try:
                    if response.next_request is None:
                        self._check_head(response)
                        data = bytearray()
                        async for chunk in response.aiter_bytes():
                            data += chunk
                            if len(data) > self.config.max_response_bytes:
                                break
                        return self._reply(response, bytes(data))
                    request = response.next_request
                finally:
                    await response.aclose()
            raise httpx.TooManyRedirects("too many redirects", request=request)

    def _budget(self, deadline: float) -> float:
        """An attempt's time: ``timeout_s``, or less when the call's deadline comes first."""
        return max(0.0, min(self.config.timeout_s, deadline - time.monotonic()))

    def _check_head(self, response: httpx.Response) -> None:
        """Before the body is read: an encoding that can grow a few KB into GBs in one step is
        refused (``bounded_encoding``), and so is a declared size over the cap when oversize
        is "error"."""
        if not bounded_encoding(response.headers.get("content-encoding")):
            raise _Refused(f"the response is encoded as {response.headers['content-encoding'][:60]!r}, which this tool does "
                           "not read; the service should answer uncompressed (identity), as asked")
        declared = response.headers.get("content-length", "")
        if self.config.oversize == "error" and declared.isascii() and declared.isdigit() and int(declared) > self.config.max_response_bytes:
            raise _Refused(f"the response is {int(declared)} bytes, over the {self.config.max_response_bytes}-byte limit; "
                           "narrow the request (filters, a smaller limit)")

    def _reply(self, response: httpx.Response, data: bytes) -> _Reply:
        cap = self.config.max_response_bytes
        if len(data) > cap and self.config.oversize == "error":
            raise _Refused(f"the response is over the {cap}-byte limit; narrow the request (filters, a smaller limit)")
        return _Reply(response.status_code, response.reason_phrase, response.headers, data[:cap], len(data) > cap,
                      response.charset_encoding)

    # -- clients: one per call, so no pooled connection outlives its event loop

    @contextmanager
    def _client(self) -> Iterator[httpx.Client]:
        transport = self._transport if isinstance(self._transport, httpx.BaseTransport) else None
        client = httpx.Client(transport=transport, **self._client_options(), event_hooks={"request": [self._guard]})
        try:
            yield client
        finally:
            if transport is None:  # closing a client closes its transport: not ours to close
                client.close()

    @asynccontextmanager
    async def _async_client(self) -> AsyncIterator[httpx.AsyncClient]:
        transport = self._transport if isinstance(self._transport, httpx.AsyncBaseTransport) else None

        async def guard(request: httpx.Request) -> None:
            self._guard(request)

        client = httpx.AsyncClient(transport=transport, **self._client_options(), event_hooks={"request": [guard]})
        try:
            yield client
        finally:
            if transport is None:
                await client.aclose()

    def _client_options(self) -> dict[str, Any]:
        auth = self.config.auth
        return {"timeout": self.config.timeout_s, "headers": {"Accept-Encoding": "identity"},  # at most max_response_bytes is read: compression saves little
                "auth": EnvAuth(auth) if auth else None, "verify": tls_context(),  # a client per call, not a CA bundle per call
                "cookies": CookieJar(DefaultCookiePolicy(allowed_domains=[]))}  # stateless: the API's cookies never come back

    def _guard(self, request: httpx.Request) -> None:
        """Runs before every request and every redirect hop (before it is sent)."""
        if self.config.auth and _origin(request.url) != self._origin:
            # httpx drops Authorization on a cross-origin hop, not a custom header: the
            # credential goes to the base URL's origin only (not another port of an allowed host)
            request.headers.pop(self.config.auth.header_name, None)
        host = request.url.host.lower()
        if host not in self._hosts:
            raise _Refused(f"refused: {host} is not an allowed host")
        if request.url.scheme != self._scheme and self._scheme == "https":
            raise _Refused(f"refused: a redirect from https to {request.url.scheme}")
        path = request.url.raw_path.split(b"?", 1)[0].decode("ascii", errors="replace")
        if not any(m == request.method and rx.fullmatch(path) for m, rx in self._routes):
            raise _Refused(f"refused: {request.method} {path} is not an allowed operation")

    # -- retries

    def _retry_policy(self, op: Operation) -> dict[str, Any]:
        statuses = RETRY_STATUS_WRITE if op.mutating else RETRY_STATUS_READ
        backoff = wait_random_exponential(multiplier=self.config.backoff_s, max=self.config.backoff_max_s)
        cap = self.config.max_retry_after_s

        def wait(state: RetryCallState) -> float:
            delay = _retry_after_of(state)
            return backoff(state) if delay is None else min(delay, cap)

        def retry_after_too_long(state: RetryCallState) -> bool:
            delay = _retry_after_of(state)
            return delay is not None and delay > cap

        def before_sleep(state: RetryCallState) -> None:
            outcome = state.outcome
            assert outcome is not None  # tenacity sleeps only after an attempt
            why = type(outcome.exception()).__name__ if outcome.failed else f"HTTP {outcome.result().status}"
            log.info("%s: %s, retry %d of %d", op.tool_name, why, state.attempt_number, self.config.max_retries)

        return {
            "retry": retry_if_exception_type(_RETRY_EXCEPTIONS) | retry_if_result(lambda r: r.status in statuses),
            # no retry starts unless a whole attempt fits before the deadline: none is cut short by it
            "stop": stop_any(stop_after_attempt(self.config.max_retries + 1),
                             stop_before_delay(max(0.0, self.config.deadline_s - self.config.timeout_s)), retry_after_too_long),
            "wait": wait,
            "before_sleep": before_sleep,
            "retry_error_callback": lambda state: state.outcome.result(),  # the last reply (or its exception)
        }

    # -- what the model sees

    def _result(self, op: Operation, reply: _Reply) -> str:
        secret = self.config.auth.secret() if self.config.auth else None
        if not 200 <= reply.status < 300:
            raise ToolException(self.redact(f"Error: {op.tool_name} failed with HTTP {reply.status} {reply.reason}"
                                             f"{_detail(reply)}{_hint(reply)}"))
        text = reply.text()
        if text is None:
            content_type = reply.headers.get("content-type") or "no content type"
            return self.redact(f"[a binary response ({content_type}, {len(reply.body)}"
                               f"{'+' if reply.truncated else ''} bytes); this tool returns text only]")
        text = redact(text, [secret], patterns=())  # data, not a message: only the literal secret
        if reply.truncated:
            text += (f"\n[truncated: the response is longer than {self.config.max_response_bytes} bytes; "
                     "narrow the request to see the rest]")
        return text or f"OK (HTTP {reply.status}, empty response)"

    def _message(self, op: Operation, error: Exception) -> str:
        if isinstance(error, _Refused):
            why = str(error)
        elif isinstance(error, TimeoutError) or (isinstance(error, httpx.TimeoutException) and not isinstance(error, httpx.ConnectTimeout)):
            seconds = min(self.config.timeout_s, self.config.deadline_s)  # an attempt's time (module doc)
            why = f"no answer within {seconds:g} s; the service is slow, try again later or ask for less"
        elif isinstance(error, _RETRY_EXCEPTIONS):
            why = f"cannot reach the service ({type(error).__name__}); try again later"
        elif isinstance(error, httpx.TooManyRedirects):
            why = f"more than {self.config.max_redirects} redirects"
        elif isinstance(error, httpx.HTTPError):
            why = f"the request failed ({type(error).__name__})"
        elif isinstance(error, httpx.InvalidURL):  # not an HTTPError: e.g. a redirect to "javascript:x"
            why = f"the request failed (an invalid URL: {error})"
        else:
            log.warning("%s: unexpected %s: %s", op.tool_name, type(error).__name__, self.redact(str(error)))
            why = f"internal error ({type(error).__name__})"
        return self.redact(f"Error: {op.tool_name}: {why}")

    def redact(self, text: str) -> str:
        secret = self.config.auth.secret() if self.config.auth else None
        return redact(text, [secret], max_chars=self.config.max_error_chars)


def openapi_tools(spec: dict[str, Any] | str | Path, config: OpenAPIToolsConfig | None = None, *,
                  transport: Transport | None = None, **fields: Any) -> list[BaseTool]:
    """One ``StructuredTool`` per allowed operation of ``spec`` (a dict, a file, or a URL).

    Settings come from ``config`` and/or keyword fields of ``OpenAPIToolsConfig``
    (``base_url=..., allow_hosts=[...]``; fields override ``config``). ``transport`` (any
    httpx transport, e.g. ``tools.replay.ReplayTransport`` or ``httpx.MockTransport``) is
    used for the requests and for fetching a spec URL. Each tool's ``metadata`` has
    ``operation_id``, ``method``, ``path`` and ``mutating``. Raises ``ValueError`` for a bad
    config, and its subclass ``SpecError`` (a ``UserError``) for a bad spec or an
    ``allow_operations`` id that the spec does not have.
    """
    cfg = OpenAPIToolsConfig.model_validate({**(config.model_dump() if config else {}), **fields})
    if transport is not None and not isinstance(transport, (httpx.BaseTransport, httpx.AsyncBaseTransport)):
        raise TypeError(f"transport must be an httpx transport, got {type(transport).__name__}")
    doc = load_spec(spec, allow_hosts=cfg.allow_hosts, transport=transport, timeout_s=cfg.timeout_s)
    ops = operations(doc, cfg.safe_operations, only=cfg.allow_operations)
    caller = _Caller(cfg, ops, transport)
    sync = transport is None or isinstance(transport, httpx.BaseTransport)
    asynchronous = transport is None or isinstance(transport, httpx.AsyncBaseTransport)
    return [
        StructuredTool(
            name=op.tool_name, description=op.description, args_schema=op.args_schema,
            func=caller.function(op) if sync else None, coroutine=caller.coroutine(op) if asynchronous else None,
            metadata=op.metadata(), handle_tool_error=True, handle_validation_error=caller.invalid_args(op),
        )
        for op in ops
    ]


def read_only_predicate(tools: Sequence[BaseTool], base_url: str) -> Callable[[httpx.Request], bool]:
    """``request -> bool`` for ``tools.replay.ReplayTransport``: True when the request is a
    read-only operation of these tools; a request matching none of them is read-only only
    by its method (GET/HEAD/OPTIONS), so an unknown POST counts as mutating."""
    base_path = httpx.URL(base_url).path.rstrip("/")
    routes = [(t.metadata["method"], route_regex(base_path + t.metadata["path"]), not t.metadata["mutating"])
              for t in tools if t.metadata and "mutating" in t.metadata]

    def read_only(request: httpx.Request) -> bool:
        path = request.url.raw_path.split(b"?", 1)[0].decode("ascii", errors="replace")
        for method, rx, safe in routes:
            if method == request.method and rx.fullmatch(path):
                return safe
        return request.method in READ_ONLY_METHODS

    return read_only


def route_regex(template: str) -> re.Pattern[str]:
    """``/books/{id}`` -> a regex over raw (percent-encoded) paths; a parameter is one segment."""
    parts = re.split(r"(\{[^}/]+\})", template)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


# ------------------------------------------------------------------------------ helpers


def _retry_after_of(state: RetryCallState) -> float | None:
    outcome = state.outcome
    if outcome is None or outcome.failed:
        return None
    reply: _Reply = outcome.result()
    return retry_after_seconds(reply.headers.get("retry-after")) if reply.status in (429, 503) else None


def _detail(reply: _Reply) -> str:
    """The server's own explanation, short: FastAPI-style ``detail``, ``message``/``error``, or the text."""
    text = (reply.text() or "").strip()
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return f": {text[:300]}" if text else ""
    if isinstance(data, dict):
        detail = data.get("detail", data.get("message", data.get("error")))
        if isinstance(detail, list):  # FastAPI validation errors
            detail = "; ".join(_validation_error(d) for d in detail[:10])
        if detail is not None:
            return f": {str(detail)[:300]}"
    return f": {text[:300]}"


def _validation_error(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)[:100]
    loc = item.get("loc")
    where = ".".join(str(x) for x in loc[1:]) if isinstance(loc, list) else ""
    return f"{where}: {str(item.get('msg'))[:100]}"


def _hint(reply: _Reply) -> str:
    status = reply.status
    if status == 429:
        delay = retry_after_seconds(reply.headers.get("retry-after"))
        return f" (rate limited: try again in {delay:.0f} s)" if delay is not None else " (rate limited: try again later)"
    if status in (401, 403):
        return " (not authorized for this operation)"
    if status >= 500:
        return " (the service failed: try again later)"
    return ""


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host.lower(), url.port or {"http": 80, "https": 443}.get(url.scheme)


def _path_segment(value: Any) -> str:
    text = _scalar(value)
    if text in ("", ".", ".."):  # would change which route the request reaches
        raise _Refused(f"invalid path parameter {text!r}")
    return quote(text, safe="")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


