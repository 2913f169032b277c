"""Record, replay and shadow HTTP traffic under any httpx client.

SEED needs G episodes per task; production gives one. The continual loop therefore
replays a production task G times against the same tool API, and those replays must not
change production data. ``ReplayTransport`` is the one place that decides what reaches
the live API. It is an httpx transport (sync and async), so ``openapi_tools(...,
transport=...)`` and any ``httpx.Client`` can use it unchanged. Modes:

- ``record``: pass every request to the live API and append the exchange (method, URL,
  normalized query, body, status, a subset of response headers, response body; secrets
  redacted) to a ``Recording`` (in memory, or a JSONL file appended line by line).
- ``replay``: answer every request from a recording, no network. A request with no
  recorded answer gets an error response (status 424, header ``x-seed-replay: miss``)
  that the agent sees, and is counted as a miss.
- ``shadow`` (training replays): read-only requests come from the recording or go live
  under a shared token-bucket rate limit (``read_source`` says which is tried first).
  Mutating requests never go to the live API: they go to the sandbox when one is
  configured, else are answered from the recording, else the transport raises
  ``Unreplayable`` and remembers it in ``.unreplayable``. An unreplayable episode is an
  infrastructure fault, never a policy failure: the runner records it and skips it.

Sandboxes. ``sandbox_app`` (an ASGI app factory) gives every episode a fresh instance of
the API in process: nothing to reset, episodes stay concurrent. ``sandbox_base_url`` is
a second running instance (any language, any host but production's): one shared state,
so ``sandbox_reset`` (an HTTP request to it, or a command) puts it back before each
episode, and whoever plays episodes (the continual loop) plays those one at a time
(``exclusive_sandbox``). A failed reset raises ``SandboxResetFailed``: that episode is an
infrastructure fault, recorded and never trained on.

Matching is deterministic: the key is method, path, sorted query and a hash of the
canonical JSON body (``match_key``), without scheme or host, so a recording made against
one base URL answers the same API anywhere. The n-th request with a key gets the n-th
recorded exchange with that key; a read asked more often than recorded gets the last one
again, a write never gets one twice (a second borrow is not the first one's success).
Per-episode state (those cursors, ``counters``, ``unreplayable``) lives in the transport:
use one per episode, ``fork()`` shares the recording, live connections and rate limit.

A session that went through the capture gateway (or ``StoreSink``) needs no recording made
on purpose: ``recording_from_transcript`` turns its transcript's tool results (each call and
the tool message that answered it) into the exchanges those calls made, by running the
same tools against a stand-in API that answers each request with the recorded text.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from seed_agents.imports import load_object
from seed_agents.redact import redact
from seed_agents.tools.openapi import READ_ONLY_METHODS, AuthConfig, EpisodeSignal, OpenAPIToolsConfig, openapi_tools
from seed_agents.tools.sandbox import SandboxReset, SandboxResetFailed, run_reset_command
from seed_agents.transcript import ToolResult
from seed_agents.types import FaultKind

Mode = Literal["record", "replay", "shadow"]
ReadSource = Literal["recording", "live", "recording_only"]
Source = Literal["recorded", "live", "sandbox"]
MISS_STATUS = 424  # Failed Dependency: not retried by the tools, and not a real "not found"
REPLAY_HEADER = "x-seed-replay"
SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"})
T = TypeVar("T")
_HOP_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection"})


class Unreplayable(EpisodeSignal):
    """A shadow replay reached a mutating request it cannot serve without touching
    production: no sandbox and no recorded answer. The runner records the episode as an
    infrastructure fault (``FaultKind.UNREPLAYABLE``) and never trains on it."""

    kind = FaultKind.UNREPLAYABLE

    def __init__(self, method: str, path: str, key: str) -> None:
        super().__init__(f"unreplayable: {method} {path} would change production data, "
                         "and there is no sandbox and no recorded answer")
        self.method, self.path, self.key = method, path, key


class Exchange(BaseModel):
    """One request and its response, as a recording stores it (secrets already redacted)."""

    model_config = ConfigDict(frozen=True)

    key: str = Field(description="The match key (see match_key).")
    method: str
    url: str = Field(description="The request URL without its query.")
    query: list[tuple[str, str]] = Field(description="Query parameters, sorted.")
    body: str | None = Field(None, description="The request body: canonical JSON, or text.")
    mutating: bool
    status: int
    headers: dict[str, str] = Field(default_factory=dict, description="The recorded subset of response headers.")
    response: str = Field("", description="The response body as text.")
    at: float = Field(default_factory=time.time, description="When it was recorded (unix time).")


class Recording:
    """Exchanges in the order they happened; with ``path``, also a JSONL file that every
    ``append`` extends by one flushed line (a process killed mid-write loses at most the
    line in flight, and ``load`` skips a torn last line). Safe to share between threads."""

    def __init__(self, exchanges: Iterable[Exchange] = (), *, path: str | Path | None = None) -> None:
        self._exchanges = list(exchanges)
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path, *, append: bool = True) -> Recording:
        """The exchanges in ``path`` (missing file: none); new ones are appended there unless ``append=False``."""
        p = Path(path)
        lines = p.read_text().splitlines() if p.exists() else []
        exchanges = []
        for i, line in enumerate(lines):
            try:
                exchanges.append(Exchange.model_validate_json(line))
            except ValueError:
                if i != len(lines) - 1:  # only the last line can be torn by a crash
                    raise ValueError(f"{p}:{i + 1} is not a recorded exchange") from None
        return cls(exchanges, path=p if append else None)

    @property
    def exchanges(self) -> list[Exchange]:
        with self._lock:
            return list(self._exchanges)

    def append(self, exchange: Exchange) -> None:
        with self._lock:
            self._exchanges.append(exchange)
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as f:
                    f.write(exchange.model_dump_json() + "\n")

    def __len__(self) -> int:
        with self._lock:
            return len(self._exchanges)


class TokenBucket:
    """At most ``rate_per_s`` requests a second on average, in bursts of up to ``burst``.
    One bucket is shared by every replay that may read the live API (thread-safe)."""

    def __init__(self, rate_per_s: float, burst: int = 1, *, clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"need rate_per_s > 0 and burst >= 1, got {rate_per_s}, {burst}")
        self.rate, self.burst, self._clock = rate_per_s, burst, clock
        self._tokens, self._last = float(burst), clock()
        self._lock = threading.Lock()

    def reserve(self, max_wait_s: float) -> float | None:
        """Take a token: the seconds to wait before using it, or None (nothing taken) when
        that would be longer than ``max_wait_s``."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
            self._last = now
            wait = max(0.0, (1.0 - self._tokens) / self.rate)
            if wait > max_wait_s:
                return None
            self._tokens -= 1.0
            return wait

    def acquire(self, max_wait_s: float) -> bool:
        wait = self.reserve(max_wait_s)
        if wait:
            time.sleep(wait)
        return wait is not None

    async def aacquire(self, max_wait_s: float) -> bool:
        wait = self.reserve(max_wait_s)
        if wait:
            await asyncio.sleep(wait)
        return wait is not None


class ReplayConfig(BaseModel):
    """What a ``ReplayTransport`` may send where."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = Field(description="record: live + append; replay: recording only; shadow: training replays (see module doc).")
    read_source: ReadSource = Field("recording", description="Shadow reads: 'recording' (then live), 'live' (then recording) "
                                                            "or 'recording_only' (never live).")
    live_reads_per_s: float = Field(2.0, gt=0, description="Shadow mode: average live reads a second, over all forks.")
    live_read_burst: int = Field(4, ge=1, description="Shadow mode: live reads allowed back to back.")
    max_wait_s: float = Field(2.0, ge=0, description="Longest wait for a live-read token before the other source (or a miss).")
    production_base_url: str | None = Field(None, description="The live API's base URL; required with a sandbox (its path "
                                                              "prefix is swapped for the sandbox's).")
    sandbox_base_url: str | None = Field(None, description="Shadow mode: mutating requests go to this running instance "
                                                           "instead (one shared state: see sandbox_reset).")
    sandbox_reset: SandboxReset | None = Field(None, description="With sandbox_base_url: how the sandbox is reset before "
                                                                "every episode (then those episodes run one at a time).")
    sandbox_app: str | None = Field(None, description="Instead of sandbox_base_url: import path of an ASGI app factory "
                                                      "(pkg.module:create_app); every episode's writes go to a fresh "
                                                      "instance of it, in process.")
    sandbox_auth: AuthConfig | None = Field(None, description="Credentials for the sandbox; production's are never sent there.")
    record_headers: tuple[str, ...] = Field(("content-type", "location", "retry-after"), description="Response headers kept.")
    ignore_query: tuple[str, ...] = Field((), description="Query parameters left out of the match key (nonces, timestamps).")
    secret_envs: tuple[str, ...] = Field((), description="Environment variables whose values are redacted from recordings.")

    @model_validator(mode="after")
    def _sandbox_is_elsewhere(self) -> ReplayConfig:
        if self.sandbox_app is not None and self.sandbox_base_url is not None:
            raise ValueError("sandbox_app and sandbox_base_url are two sandboxes: set one")
        if self.sandbox_app is not None and ":" not in self.sandbox_app:
            raise ValueError(f"sandbox_app {self.sandbox_app!r} is not an import path of the form 'package.module:factory'")
        if self.sandbox_reset is not None and self.sandbox_base_url is None:
            raise ValueError("sandbox_reset resets a sandbox_base_url (a sandbox_app is fresh for every episode already)")
        if self.sandbox_base_url is None:
            return self
        if self.production_base_url is None:
            raise ValueError("sandbox_base_url needs production_base_url (to map paths and to check they differ)")
        if _origin(self.sandbox_base_url) == _origin(self.production_base_url):
            raise ValueError(f"sandbox_base_url {self.sandbox_base_url!r} is production's origin")
        return self


@dataclass
class ReplayCounters:
    """What one transport did. ``live_writes`` is production traffic: only record mode has any."""

    live_reads: int = 0
    live_writes: int = 0
    recorded: int = 0  # answers from the recording, reads and writes
    sandbox_writes: int = 0
    blocked_writes: int = 0  # mutating requests kept from production without a sandbox (recorded, missed or unreplayable)
    misses: int = 0  # requests that no source could answer

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def match_key(method: str, url: httpx.URL, body: bytes, *, ignore_query: Sequence[str] = (), secrets: Sequence[str] = ()) -> str:
    """``"POST /loans #<sha256 of canonical body>"``, ``"GET /books?limit=5&q=dune"``: scheme
    and host left out, query sorted, JSON bodies canonical (key order and spacing do not
    matter), secrets redacted first (so a recorded key equals the replayed one)."""
    path = redact(url.path, secrets)
    query = _query(url, ignore_query, secrets)
    key = f"{method.upper()} {path}" + (f"?{urlencode(query)}" if query else "")
    canonical = _canonical_body(body, secrets)
    return key + (f" #{hashlib.sha256(canonical.encode()).hexdigest()[:16]}" if canonical else "")


class ReplayTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """An httpx transport that records, replays or shadows (see the module docstring).

    ``live``: the transport to the real network (default: httpx's own; tests pass a
    ``MockTransport``). ``is_read_only``: which requests cannot change data (default: by
    method; ``tools.openapi.read_only_predicate(tools, base_url)`` adds the spec's
    ``safe_operations``). ``limiter``: a shared ``TokenBucket`` (default: one from the config).
    """

    def __init__(self, config: ReplayConfig, recording: Recording | None = None, *,
                 live: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
                 is_read_only: Callable[[httpx.Request], bool] | None = None, limiter: TokenBucket | None = None) -> None:
        if config.sandbox_auth is not None and config.sandbox_auth.secret() is None:
            raise ValueError(f"sandbox_auth reads {config.sandbox_auth.env}, which is not set")
        self.config = config
        self.recording = recording if recording is not None else Recording()
        self._sandbox_factory: Callable[[], Any] | None = load_object(config.sandbox_app) if config.sandbox_app else None
        self._is_read_only = is_read_only or (lambda r: r.method in READ_ONLY_METHODS)
        self._limiter = limiter or TokenBucket(config.live_reads_per_s, config.live_read_burst)
        self._owns_live = live is None and config.mode != "replay"
        if self._owns_live:
            self._sync_live: httpx.BaseTransport | None = httpx.HTTPTransport()
            self._async_live: httpx.AsyncBaseTransport | None = httpx.AsyncHTTPTransport()
        else:
            self._sync_live = live if isinstance(live, httpx.BaseTransport) else None
            self._async_live = live if isinstance(live, httpx.AsyncBaseTransport) else None
        self._index: dict[str, list[Exchange]] = defaultdict(list)
        for exchange in self.recording.exchanges if config.mode != "record" else ():
            self._index[exchange.key].append(exchange)
        self._new_episode()

    def _new_episode(self) -> None:
        self.counters = ReplayCounters()
        self.unreplayable: Unreplayable | None = None
        self.sandbox_resets = 0
        self._sandbox_instance: httpx.AsyncBaseTransport | None = None  # sandbox_app: this episode's own API
        self._seen: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def fork(self) -> ReplayTransport:
        """A transport for the next episode: fresh cursors, counters and flag (and a fresh
        ``sandbox_app`` instance); the same recording, live connections and rate limit
        (closing a fork closes nothing shared)."""
        clone = copy.copy(self)
        clone._owns_live = False
        clone._new_episode()
        return clone

    # -- httpx entry points: decide the sources, try them in order

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        key, read_only, nth = self._classify(request)
        for source in self._sources(read_only):
            if source == "recorded":
                response = self._recorded(key, nth, read_only)
            elif source == "live" and not self._may_go_live():
                response = None
            else:
                response = self._sync_to(source).handle_request(self._target(source, request))
                response.read()
                response = self._after_live(source, request, key, read_only, response)
            if response is not None:
                return response
        return self._dead_end(request, key, read_only)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        key, read_only, nth = self._classify(request)
        for source in self._sources(read_only):
            if source == "recorded":
                response = self._recorded(key, nth, read_only)
            elif source == "live" and not await self._may_go_live_async():
                response = None
            else:
                response = await self._async_to(source).handle_async_request(self._target(source, request))
                await response.aread()
                response = self._after_live(source, request, key, read_only, response)
            if response is not None:
                return response
        return self._dead_end(request, key, read_only)

    # -- the sandbox: where writes go, and its reset before an episode

    @property
    def exclusive_sandbox(self) -> bool:
        """True when episodes share one sandbox that is reset before each: play them one at a time."""
        return self.config.sandbox_reset is not None

    def reset_sandbox(self) -> None:
        """Put the URL sandbox back to its initial state (``sandbox_reset``); call it before
        the episode that uses this transport. A no-op without a reset hook. Raises
        ``SandboxResetFailed`` when the request fails or answers non-2xx, or the command
        fails, within ``timeout_s``. Blocking (async callers: ``asyncio.to_thread``)."""
        reset = self.config.sandbox_reset
        if reset is None:
            return
        if reset.command is not None:
            run_reset_command(reset.command, reset.timeout_s)
        else:
            assert self.config.sandbox_base_url is not None and reset.path is not None  # checked by the configs
            base = httpx.URL(self.config.sandbox_base_url)
            url = base.copy_with(raw_path=base.raw_path.rstrip(b"/") + reset.path.encode())
            what = f"{reset.method} {url}"
            headers = self.config.sandbox_auth.headers() if self.config.sandbox_auth is not None else {}
            request = httpx.Request(reset.method, url, headers=headers, json=reset.body,
                                    extensions={"timeout": httpx.Timeout(reset.timeout_s).as_dict()})
            try:
                response = self._live(self._sync_live, "sync").handle_request(request)
                response.read()
            except httpx.HTTPError as e:
                raise SandboxResetFailed(f"sandbox reset {what} failed: {type(e).__name__}: {e}") from e
            if not response.is_success:
                raise SandboxResetFailed(f"sandbox reset {what} answered HTTP {response.status_code}: "
                                         f"{' '.join(response.text.split())[:300]}")
        self.sandbox_resets += 1

    def _sync_to(self, source: Source) -> httpx.BaseTransport:
        if source == "sandbox" and self._sandbox_factory is not None:
            raise TypeError("sandbox_app serves async clients only (httpx.ASGITransport): call the tools with ainvoke")
        return self._live(self._sync_live, "sync")

    def _async_to(self, source: Source) -> httpx.AsyncBaseTransport:
        if source == "sandbox" and self._sandbox_factory is not None:
            if self._sandbox_instance is None:  # this episode's first write: its own fresh API
                self._sandbox_instance = httpx.ASGITransport(app=self._sandbox_factory())
            return self._sandbox_instance
        return self._live(self._async_live, "async")

    def close(self) -> None:
        """Close the live connections this transport opened (not a caller's ``live``, not a fork's)."""
        if self._owns_live and self._sync_live is not None:
            self._sync_live.close()

    async def aclose(self) -> None:
        if self._owns_live and self._async_live is not None:
            await self._async_live.aclose()

    # -- decisions (no I/O)

    def _classify(self, request: httpx.Request) -> tuple[str, bool, int]:
        """The request's match key, whether it is read-only, and how many times this
        episode sent the same key before (its occurrence number)."""
        key = match_key(request.method, request.url, request.content, ignore_query=self.config.ignore_query,
                        secrets=self._secrets(request))
        with self._lock:
            nth = self._seen[key]
            self._seen[key] += 1
        return key, self._is_read_only(request), nth

    def _sources(self, read_only: bool) -> tuple[Source, ...]:
        """Where a request may be answered from, in order. The only way a mutating request
        reaches the live API is record mode: that *is* the production traffic."""
        mode = self.config.mode
        if mode == "record":
            return ("live",)
        if mode == "replay":
            return ("recorded",)
        if not read_only:
            return ("sandbox",) if self.config.sandbox_base_url or self.config.sandbox_app else ("recorded",)
        return {"recording": ("recorded", "live"), "live": ("live", "recorded"),
                "recording_only": ("recorded",)}[self.config.read_source]

    def _recorded(self, key: str, nth: int, read_only: bool) -> httpx.Response | None:
        candidates = self._index.get(key, [])
        if nth < len(candidates):
            exchange = candidates[nth]
        elif read_only and candidates:
            exchange = candidates[-1]  # the same read again: the latest answer we know
        else:
            return None
        with self._lock:
            self.counters.recorded += 1
            self.counters.blocked_writes += not read_only and self.config.mode != "record"
        headers = {**{k: v for k, v in exchange.headers.items() if k.lower() not in _HOP_HEADERS}, REPLAY_HEADER: "recorded"}
        return httpx.Response(exchange.status, headers=headers, content=exchange.response.encode())

    def _may_go_live(self) -> bool:
        """Shadow reads share the rate limit; record mode is the production traffic itself."""
        return self.config.mode != "shadow" or self._limiter.acquire(self.config.max_wait_s)

    async def _may_go_live_async(self) -> bool:
        return self.config.mode != "shadow" or await self._limiter.aacquire(self.config.max_wait_s)

    def _target(self, source: Source, request: httpx.Request) -> httpx.Request:
        """The request as it goes out: unchanged to the live API; to the sandbox with its
        base URL (a sandbox_app gets the URL as it is), without production's credentials,
        with the sandbox's own."""
        if source == "live":
            if self.config.mode == "shadow" and not self._is_read_only(request):  # unreachable by _sources; kept as a wall
                raise RuntimeError("refusing to send a mutating shadow request to the live API")
            return request
        url = request.url
        if self._sandbox_factory is None:
            assert self.config.sandbox_base_url and self.config.production_base_url  # checked by ReplayConfig
            prod, sandbox = httpx.URL(self.config.production_base_url), httpx.URL(self.config.sandbox_base_url)
            relative = request.url.raw_path.removeprefix(prod.raw_path.rstrip(b"/"))
            url = sandbox.copy_with(raw_path=sandbox.raw_path.rstrip(b"/") + relative)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in SENSITIVE_HEADERS | {"host"}}
        if self.config.sandbox_auth is not None:
            headers.update(self.config.sandbox_auth.headers())
        return httpx.Request(request.method, url, headers=headers, content=request.content)

    def _after_live(self, source: Source, request: httpx.Request, key: str, read_only: bool,
                    response: httpx.Response) -> httpx.Response:
        """Count what went where; in record mode, append the exchange. The body has been
        read, so the response is rebuilt without its transfer encodings."""
        with self._lock:
            if source == "sandbox":
                self.counters.sandbox_writes += 1
            elif read_only:
                self.counters.live_reads += 1
            else:
                self.counters.live_writes += 1
        if self.config.mode == "record":
            self.recording.append(self._exchange(request, key, read_only, response))
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _HOP_HEADERS]
        headers.append((REPLAY_HEADER, source))
        return httpx.Response(response.status_code, headers=headers, content=response.content,  # read() closed the stream
                              extensions={"reason_phrase": response.reason_phrase.encode()})

    def _dead_end(self, request: httpx.Request, key: str, read_only: bool) -> httpx.Response:
        """No source answered: a miss response, or (a shadow write) ``Unreplayable``."""
        with self._lock:
            self.counters.misses += 1
            self.counters.blocked_writes += not read_only
        if self.config.mode == "shadow" and not read_only:
            signal = Unreplayable(request.method, request.url.path, key)
            with self._lock:
                self.unreplayable = self.unreplayable or signal
            raise signal
        detail = (f"no recorded response for {request.method} {request.url.path} ({self.config.mode} mode); "
                  "this request cannot be answered in a replay")
        return httpx.Response(MISS_STATUS, headers={REPLAY_HEADER: "miss"}, json={"detail": detail})

    # -- recording

    def _exchange(self, request: httpx.Request, key: str, read_only: bool, response: httpx.Response) -> Exchange:
        secrets = self._secrets(request)
        kept = {k: redact(response.headers[k], secrets) for k in self.config.record_headers if k in response.headers}
        url = request.url.copy_with(query=None)
        return Exchange(key=key, method=request.method, url=redact(str(url), secrets),
                        query=_query(request.url, (), secrets), body=_canonical_body(request.content, secrets) or None,
                        mutating=not read_only, status=response.status_code, headers=kept,
                        response=redact(response.text, secrets))

    def _secrets(self, request: httpx.Request) -> list[str]:
        """Literal secrets to redact: credentials the request carries, and configured env values."""
        values = [v for k, v in request.headers.items() if k.lower() in SENSITIVE_HEADERS]
        values += [v.split(" ", 1)[1] for v in values if " " in v]  # "Bearer <token>": the token alone too
        return values + [v for name in self.config.secret_envs if (v := os.environ.get(name))]

    def _live(self, transport: T | None, kind: str) -> T:
        if transport is None:
            raise TypeError(f"this ReplayTransport has no {kind} live transport (mode {self.config.mode!r}, "
                            f"or a live transport that is not {kind})")
        return transport


def _origin(url: str) -> tuple[str, str, int | None]:
    u = httpx.URL(url)
    return u.scheme, u.host.lower(), u.port


def _query(url: httpx.URL, ignore: Sequence[str], secrets: Sequence[str]) -> list[tuple[str, str]]:
    return sorted((k, redact(v, secrets)) for k, v in url.params.multi_items() if k not in ignore)


def _canonical_body(body: bytes, secrets: Sequence[str]) -> str:
    """JSON bodies with sorted keys and no spacing; other bodies as text; both redacted."""
    if not body:
        return ""
    text = body.decode("utf-8", errors="replace")
    try:
        text = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        pass
    return redact(text, secrets)


_HTTP_ERROR = re.compile(r"^Error: \S+ failed with HTTP (\d{3})[^:\n]*(?:: (.*))?$", re.DOTALL)


def recording_from_transcript(spec: dict[str, Any] | str | Path, tools_config: OpenAPIToolsConfig,
                              results: Sequence[ToolResult], config: ReplayConfig | None = None, *,
                              is_read_only: Callable[[httpx.Request], bool] | None = None) -> Recording:
    """The exchanges ``results`` (a session transcript's tool calls and answers) stand for.

    Each call runs through the tools generated from ``spec`` (no credentials: they are not
    part of a match key) on a stand-in API that answers with the tool message's text: 200,
    or the status of a tool error the tools wrote (``Error: x failed with HTTP 404 ...``).
    Results that made no request the tools could repeat (invalid arguments, an unreachable
    service, 429 and 5xx answers, unknown tools) are left out: a replay reads those live
    or misses. Calls are played in the session's order, so the n-th call with a key gets
    the n-th answer, as in a recording made live."""
    cfg = ReplayConfig(mode="record", ignore_query=(config.ignore_query if config else ()),
                       secret_envs=(config.secret_envs if config else ()))
    answer: list[tuple[int, str]] = []

    def respond(request: httpx.Request) -> httpx.Response:
        status, text = answer[0]
        return httpx.Response(status, text=text, headers={"content-type": "text/plain; charset=utf-8"})

    recording = Recording()
    transport = ReplayTransport(cfg, recording, live=httpx.MockTransport(respond), is_read_only=is_read_only)
    tools = {t.name: t for t in openapi_tools(spec, tools_config.model_copy(update={"auth": None, "max_retries": 0}),
                                              transport=transport)}
    for result in results:
        status, text = 200, result.content
        if result.content.startswith("Error: "):
            m = _HTTP_ERROR.match(result.content)
            if m is None or not 400 <= int(m.group(1)) < 500 or int(m.group(1)) == 429:
                continue
            status, text = int(m.group(1)), (m.group(2) or "").strip()
        if result.name not in tools:
            continue
        answer[:] = [(status, text)]
        tools[result.name].invoke(result.args)
    return recording
