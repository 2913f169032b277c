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

Retries use tenacity: 429/502/503/504 and connection failures, honouring Retry-After up
to a cap (a longer wait is not retried: the model is told to come back later), otherwise
jittered exponential backoff. A mutating operation is retried only where the server
cannot have acted on it (429, 503, no connection): after a 502 or 504 a POST may already
have borrowed the book.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

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
    stop_after_delay,
    stop_any,
    wait_random_exponential,
)

from seed_agents.faults import EpisodeFault
from seed_agents.http import retry_after_seconds  # the shared Retry-After reading
from seed_agents.redact import redact

# the spec side, named here too: `from seed_agents.tools.openapi import load_spec` is the public path
from seed_agents.tools.openapi_spec import (  # noqa: F401
    HTTP_METHODS,
    READ_ONLY_METHODS,
    Operation,
    Param,
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


class _Refused(Exception):
    """A request the guards stopped, or that cannot be built; the message is for the model."""


class AuthConfig(BaseModel):
    """Credentials for the API, by environment variable name only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["bearer", "header"] = Field(description="bearer: 'Authorization: Bearer <value>'; header: '<header>: <value>'.")
    env: str = Field(min_length=1, description="Environment variable holding the credential; read per request, never stored.")
    header: str = Field("X-Api-Key", min_length=1, description="Header name for kind='header'.")

    def secret(self) -> str | None:
        """The credential now (None when the variable is unset or empty)."""
        return os.environ.get(self.env) or None

    def headers(self) -> dict[str, str]:
        """The header to send; raises ``_Refused`` (a tool message) when the variable is unset."""
        value = self.secret()
        if value is None:
            raise _Refused(f"the API needs credentials, but the environment variable {self.env} is not set")
        return {"Authorization": f"Bearer {value}"} if self.kind == "bearer" else {self.header: value}


class OpenAPIToolsConfig(BaseModel):
    """How tools reach one API. Every field is documented; YAML configs validate against it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(description="The API's base URL (http or https); operation paths are appended to it.")
    allow_hosts: tuple[str, ...] = Field(min_length=1, description="Hostnames requests may go to; the base URL's host must be one.")
    allow_operations: tuple[str, ...] | None = Field(None, description="operationIds that become tools (default: all).")
    safe_operations: tuple[str, ...] = Field((), description="operationIds that are read-only although their method is not GET/HEAD/OPTIONS.")
    auth: AuthConfig | None = Field(None, description="Credentials from an environment variable (none: no auth header).")
    timeout_s: float = Field(10.0, gt=0, description="Per-attempt timeout (connect, read, write, pool).")
    max_retries: int = Field(3, ge=0, le=10, description="Retries after the first attempt on 429/5xx/connection failures.")
    deadline_s: float = Field(60.0, gt=0, description="No retry once this many seconds have passed since the first attempt.")
    max_retry_after_s: float = Field(30.0, ge=0, description="Longest Retry-After honoured; a longer one ends the retries.")
    backoff_s: float = Field(0.5, gt=0, description="Base of the jittered exponential backoff (no Retry-After).")
    backoff_max_s: float = Field(8.0, gt=0, description="Longest single backoff wait.")
    max_response_bytes: int = Field(32_768, ge=256, description="Response bodies past this size are cut (or refused, see oversize).")
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

    def text(self) -> str:
        return self.body.decode("utf-8", errors="ignore")


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
        try:
            request = self._request(op, args)
            with self._client() as client:
                reply = Retrying(**self._retry_policy(op))(self._attempt, client, request)
            return self._result(op, reply)
        except (EpisodeSignal, ToolException):
            raise
        except Exception as e:  # noqa: BLE001 -- the tool boundary: nothing else may escape into the graph
            raise ToolException(self._message(op, e)) from None

    async def arun(self, op: Operation, /, **args: Any) -> str:
        try:
            request = self._request(op, args)
            async with self._async_client() as client:
                reply = await AsyncRetrying(**self._retry_policy(op))(self._async_attempt, client, request)
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

    def _attempt(self, client: httpx.Client, req: _Request) -> _Reply:
        with client.stream(req.method, req.url, params=req.params, json=req.json if req.has_body else None) as response:
            self._check_declared_size(response)
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > self.config.max_response_bytes:
                    break
            return self._reply(response, bytes(data))

    async def _async_attempt(self, client: httpx.AsyncClient, req: _Request) -> _Reply:
        async with client.stream(req.method, req.url, params=req.params, json=req.json if req.has_body else None) as response:
            self._check_declared_size(response)
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > self.config.max_response_bytes:
                    break
            return self._reply(response, bytes(data))

    def _check_declared_size(self, response: httpx.Response) -> None:
        declared = response.headers.get("content-length", "")
        if self.config.oversize == "error" and declared.isdigit() and int(declared) > self.config.max_response_bytes:
            raise _Refused(f"the response is {int(declared)} bytes, over the {self.config.max_response_bytes}-byte limit; "
                           "narrow the request (filters, a smaller limit)")

    def _reply(self, response: httpx.Response, data: bytes) -> _Reply:
        cap = self.config.max_response_bytes
        if len(data) > cap and self.config.oversize == "error":
            raise _Refused(f"the response is over the {cap}-byte limit; narrow the request (filters, a smaller limit)")
        return _Reply(response.status_code, response.reason_phrase, response.headers, data[:cap], len(data) > cap)

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
        return {"timeout": self.config.timeout_s, "follow_redirects": True, "max_redirects": self.config.max_redirects,
                "auth": _EnvAuth(auth) if auth else None}

    def _guard(self, request: httpx.Request) -> None:
        """Runs before every request and every redirect hop."""
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
            "stop": stop_any(stop_after_attempt(self.config.max_retries + 1), stop_after_delay(self.config.deadline_s),
                             retry_after_too_long),
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
        text = redact(reply.text(), [secret], patterns=())  # data, not a message: only the literal secret
        if reply.truncated:
            text += (f"\n[truncated: the response is longer than {self.config.max_response_bytes} bytes; "
                     "narrow the request to see the rest]")
        return text or f"OK (HTTP {reply.status}, empty response)"

    def _message(self, op: Operation, error: Exception) -> str:
        if isinstance(error, _Refused):
            why = str(error)
        elif isinstance(error, httpx.TimeoutException) and not isinstance(error, httpx.ConnectTimeout):
            why = f"no answer within {self.config.timeout_s:g} s; the service is slow, try again later or ask for less"
        elif isinstance(error, _RETRY_EXCEPTIONS):
            why = f"cannot reach the service ({type(error).__name__}); try again later"
        elif isinstance(error, httpx.TooManyRedirects):
            why = f"more than {self.config.max_redirects} redirects"
        elif isinstance(error, httpx.HTTPError):
            why = f"the request failed ({type(error).__name__})"
        else:
            log.warning("%s: unexpected %s: %s", op.tool_name, type(error).__name__, self.redact(str(error)))
            why = f"internal error ({type(error).__name__})"
        return self.redact(f"Error: {op.tool_name}: {why}")

    def redact(self, text: str) -> str:
        secret = self.config.auth.secret() if self.config.auth else None
        return redact(text, [secret], max_chars=self.config.max_error_chars)


class _EnvAuth(httpx.Auth):
    """Sets the credential on each outgoing request, read from the environment just then."""

    def __init__(self, config: AuthConfig) -> None:
        self._config = config

    def auth_flow(self, request: httpx.Request) -> Iterator[httpx.Request]:
        request.headers.update(self._config.headers())
        yield request


def openapi_tools(spec: dict[str, Any] | str | Path, config: OpenAPIToolsConfig | None = None, *,
                  transport: Transport | None = None, **fields: Any) -> list[BaseTool]:
    """One ``StructuredTool`` per allowed operation of ``spec`` (a dict, a file, or a URL).

    Settings come from ``config`` and/or keyword fields of ``OpenAPIToolsConfig``
    (``base_url=..., allow_hosts=[...]``; fields override ``config``). ``transport`` (any
    httpx transport, e.g. ``tools.replay.ReplayTransport`` or ``httpx.MockTransport``) is
    used for the requests and for fetching a spec URL. Each tool's ``metadata`` has
    ``operation_id``, ``method``, ``path`` and ``mutating``. Raises ``ValueError`` for a bad
    config or spec, or an ``allow_operations`` id that the spec does not have.
    """
    cfg = OpenAPIToolsConfig.model_validate({**(config.model_dump() if config else {}), **fields})
    if transport is not None and not isinstance(transport, (httpx.BaseTransport, httpx.AsyncBaseTransport)):
        raise TypeError(f"transport must be an httpx transport, got {type(transport).__name__}")
    doc = load_spec(spec, allow_hosts=cfg.allow_hosts, transport=transport, timeout_s=cfg.timeout_s)
    ops = operations(doc, cfg.safe_operations)
    if cfg.allow_operations is not None:
        if unknown := sorted(set(cfg.allow_operations) - {o.operation_id for o in ops}):
            raise ValueError(f"allow_operations names operations the spec does not have: {unknown}; "
                             f"it has {[o.operation_id for o in ops]}")
        ops = [o for o in ops if o.operation_id in cfg.allow_operations]
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
    text = reply.text().strip()
    try:
        data = json.loads(text)
    except ValueError:
        return f": {text[:300]}" if text else ""
    if isinstance(data, dict):
        detail = data.get("detail", data.get("message", data.get("error")))
        if isinstance(detail, list):  # FastAPI validation errors
            detail = "; ".join(f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}" if isinstance(d, dict) else str(d)
                               for d in detail)
        if detail is not None:
            return f": {str(detail)[:300]}"
    return f": {text[:300]}"


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


def _path_segment(value: Any) -> str:
    text = _scalar(value)
    if text in ("", ".", ".."):  # would change which route the request reaches
        raise _Refused(f"invalid path parameter {text!r}")
    return quote(text, safe="")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


