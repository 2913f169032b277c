"""Hostile input, generated: a hostile server against ``seed_agents.tools.openapi``.

A response, however hostile, ends the call as a tool message within its time: redirects
off the allowlist (never followed; the credential never reaches another origin), redirect
loops, bodies of 50 MB or endless or gzip bombs (read only up to the cap), wrong content
types, broken framing, bad cookies, resets, 5xx with any Retry-After, and a server that
drips its headers or body a byte at a time (httpx's timeouts are per read; the tool's
``timeout_s`` must hold as a total, and ``deadline_s`` for the call). Hypothesis draws the
raw bytes of quick answers; the slow ones are a short explicit list, sync and async. A
server that serves the spec itself gets the same treatment: one ``SpecError``, in time.

The server is a raw loopback socket server (stdlib ``socketserver``), not uvicorn: a
hostile server must be able to break HTTP itself (drip a status line, lie about lengths,
reset mid-body), which a well-behaved ASGI server never lets an app do. Budgets are fixed
and generation derandomized, so a run is repeatable and bounded (about 25 s on 2 busy
cores); a longer hunt is the same code with bigger budgets and ``derandomize=False``.
The hostile-spec half is ``test_openapi_hostile_spec.py``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import socket
import socketserver
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import ToolMessage

from seed_agents.tools.openapi import AuthConfig, SpecError, load_spec, openapi_tools

CANARY = "canary-hostile-3e9d0b7c51"
KEY_ENV = "HOSTILE_API_KEY"
# scheduling on a loaded 2-core machine: at 1 s both gzip-bomb cases (50 MB inflated) failed once in a unit-tier
# run beside a training job, where only their time bound can vary. A drip that defeats the timeout runs for
# ever, and a Retry-After of 5 s obeyed would still exceed the 2 s + this that its case allows
SLACK_S = 2.0
FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))

@dataclass
class Seen:
    """One request as the server read it."""

    method: str
    target: str
    headers: dict[str, str]


Behaviour = Callable[[socket.socket, "Seen", "HostileServer"], None]


class HostileServer:
    """A loopback server that answers each connection with ``behaviour`` (raw bytes on the
    socket, or silence) after reading the request, and records every request it read.
    ``peer`` is the port of another one (``{other}`` in a ``raw`` answer)."""

    def __init__(self) -> None:
        owner = self
        self.behaviour: Behaviour = lambda conn, seen, server: None
        self.requests: list[Seen] = []
        self.closing = threading.Event()
        self.peer = 0

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                conn.settimeout(10)
                try:
                    seen = owner._read(conn)
                    if seen is not None:
                        owner.requests.append(seen)
                        owner.behaviour(conn, seen, owner)
                except OSError:  # the client hung up (it stopped reading: that is the point)
                    pass

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True  # a handler still dripping does not hold up the end of the tests
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def _read(conn: socket.socket) -> Seen | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        first, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        while len(body) < int(headers.get("content-length", 0)):
            chunk = conn.recv(65536)
            if not chunk:
                return None
            body += chunk
        method, target, _ = first.split(" ", 2)
        return Seen(method, target, headers)

    def sleep(self, seconds: float) -> None:
        if self.closing.wait(seconds):
            raise OSError("server closing")

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def raw(*parts: bytes) -> Behaviour:
    def send(conn: socket.socket, seen: Seen, server: HostileServer) -> None:
        for part in parts:
            conn.sendall(part.replace(b"{other}", str(server.peer).encode()))
    return send


def http(status: int, body: bytes = b"", headers: dict[str, str] | None = None, *, length: bool = True) -> bytes:
    lines = [f"HTTP/1.1 {status} Status", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join([*lines, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + body


SPEC = {"openapi": "3.0.0", "paths": {
    "/items/{item_id}": {"get": {"operationId": "get_item", "parameters": [
        {"name": "item_id", "in": "path", "required": True, "schema": {"type": "string"}}]}},
    "/items": {"post": {"operationId": "create_item", "requestBody": {"content": {"application/json": {"schema": {
        "type": "object", "properties": {"name": {"type": "string"}}}}}}}},
}}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[HostileServer, HostileServer]]:
    """The API, and another origin on the same allowed host (another port)."""
    api, other = HostileServer(), HostileServer()
    api.peer = other.port
    os.environ[KEY_ENV] = CANARY
    try:
        yield api, other
    finally:
        os.environ.pop(KEY_ENV, None)
        api.close()
        other.close()


def hostile_tools(api: HostileServer, **fields: Any) -> dict[str, Any]:
    options = {"base_url": api.url, "allow_hosts": ["127.0.0.1"], "auth": AuthConfig(kind="header", env=KEY_ENV),
               "timeout_s": 1.0, "deadline_s": 2.0, "max_retries": 1, "backoff_s": 0.01, "backoff_max_s": 0.02,
               "max_retry_after_s": 0.2, "max_response_bytes": 4096, "max_redirects": 3, **fields}
    return {t.name: t for t in openapi_tools(SPEC, **options)}


def timed_call(tool: Any, args: dict[str, Any], use_async: bool) -> tuple[ToolMessage, float]:
    call = {"type": "tool_call", "id": "c1", "name": tool.name, "args": args}
    start = time.monotonic()
    message = asyncio.run(tool.ainvoke(call)) if use_async else tool.invoke(call)
    return message, time.monotonic() - start


def assert_bounded(message: ToolMessage, elapsed: float) -> None:
    """A tool message, within the call's deadline, no longer than the body cap (or the error
    cap) allows, without the credential (limits as ``hostile_tools`` sets them)."""
    assert isinstance(message, ToolMessage) and isinstance(message.content, str)
    assert elapsed <= 2.0 + SLACK_S, f"{elapsed:.2f} s: {message.content[:200]}"
    assert len(message.content) <= 4096 + 200, len(message.content)
    assert CANARY not in message.content and CANARY[:12] not in message.content


# -- generated: every quick way a response can be wrong, as raw bytes

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
BODIES = st.sampled_from([b"", b'{"ok": true}', b"<html><body>Login</body></html>", PNG, b"{not json", b"[" * 30_000,
                          json.dumps({"detail": [{"loc": 5, "msg": None}, "x", {"loc": ["body", "a"], "msg": "bad"}]}).encode(),
                          json.dumps({"detail": {"nested": ["x"] * 500}}).encode(), "caf\u00e9 \u540d".encode("utf-16"),
                          b"\x00" * 100, b"A" * 20_000, b"echo"]) | st.binary(max_size=300)
CONTENT_TYPES = st.sampled_from(["application/json", "text/html", "text/plain; charset=latin-1", "image/png", "",
                                 "application/json; charset=base64", "application/json; charset=utf-16",
                                 "text/plain; charset=no-such-codec", "application/octet-stream"]) | st.text(max_size=20)
LOCATIONS = st.sampled_from(["https://evil.example/steal", "http://localhost:{other}/items/1", "http://127.0.0.1:{other}/items/1",
                             "/items/2", "/admin/wipe", "//evil.example/x", "ftp://127.0.0.1/x", "http://[::1", "javascript:x",
                             "http://127.0.0.1:{other}/items/\u540d", "file:///etc/passwd", ""])
RETRY_AFTER = st.sampled_from(["0", "0.05", "-1", "nan", "inf", "1e400", "soon", "Wed, 21 Oct 2015 07:28:00 GMT"]) | st.text(max_size=8)
HEADER_NAMES = st.sampled_from(["X-Odd", "Content-Length", "Transfer-Encoding", "Set-Cookie", "Bad Name", ""]) | st.text(max_size=6)


def _encode(body: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(body)
    if how == "deflate":
        return zlib.compress(body)
    return body[:5] + b"\x00corrupt" if how == "broken" else body


@st.composite
def raw_responses(draw: st.DrawFn) -> tuple[bytes, bool]:
    """(the bytes the server sends, whether it echoes the credential it got into them)."""
    status = draw(st.sampled_from([200, 201, 204, 301, 302, 303, 307, 308, 400, 401, 404, 422, 429, 500, 502, 503, 504])
                  | st.integers(200, 599))
    body = draw(BODIES)
    echo = body == b"echo"
    encoding = draw(st.sampled_from(["", "", "gzip", "deflate", "broken", "br", "zstd", "gzip, gzip", "identity, gzip"]))
    body = _encode(body, "gzip" if "," in encoding or encoding in ("br", "zstd") else encoding)
    headers = [("Content-Type", draw(CONTENT_TYPES))]
    if encoding:
        headers.append(("Content-Encoding", "gzip" if encoding == "broken" else encoding))
    if draw(st.booleans()):
        headers.append(("Location", draw(LOCATIONS)))
    if draw(st.booleans()):
        headers.append(("Retry-After", draw(RETRY_AFTER)))
    headers += draw(st.lists(st.tuples(HEADER_NAMES, st.text(max_size=12)), max_size=2))
    framing = draw(st.sampled_from(["length", "length", "chunked", "close", "short", "long"]))
    if framing == "chunked":
        headers.append(("Transfer-Encoding", "chunked"))
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:100], body[100:]) if c) + b"0\r\n\r\n"
    elif framing != "close":
        headers.append(("Content-Length", str(len(body) + {"length": 0, "short": -1, "long": 1000}[framing])))
    head = f"HTTP/1.1 {status} {draw(st.sampled_from(['OK', '', 'Reason ' * 40]))}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers) + "Connection: close\r\n\r\n"
    return head.encode("utf-8", errors="replace") + body, echo


@settings(FUZZ, max_examples=150)
@given(response=raw_responses(), use_async=st.booleans(), write=st.booleans())
def test_any_quick_hostile_response_ends_as_a_tool_message(servers: tuple[HostileServer, HostileServer],
                                                           response: tuple[bytes, bool], use_async: bool, write: bool) -> None:
    api, other = servers
    data, echo = response
    data = data.replace(b"{other}", str(other.port).encode())

    def answer(conn: socket.socket, seen: Seen, server: HostileServer) -> None:
        conn.sendall(data.replace(b"echo", seen.headers.get("x-api-key", "none").encode()) if echo else data)

    api.behaviour = other.behaviour = answer
    other.requests.clear()
    tool = hostile_tools(api)["create_item" if write else "get_item"]
    message, elapsed = timed_call(tool, {"name": "lamp"} if write else {"item_id": "1"}, use_async)
    assert_bounded(message, elapsed)
    assert "internal error" not in message.content, message.content  # no bug behind a message
    for seen in other.requests:  # another origin may be asked (an allowed host), but never with the credential
        assert "x-api-key" not in seen.headers and seen.headers.get("host", "").startswith("127.0.0.1")


# -- explicit: the slow and the huge, each against a total deadline


def drip(head: bytes, body: bytes, every_s: float = 0.3, *, from_start: bool = False) -> Behaviour:
    """Send ``head`` (at once, or a byte at a time too), then ``body`` a byte every ``every_s``."""
    def send(conn: socket.socket, seen: Seen, server: HostileServer) -> None:
        if not from_start:
            conn.sendall(head)
        for byte in (head if from_start else b"") + body:
            conn.sendall(bytes([byte]))
            server.sleep(every_s)
    return send


def endless(head: bytes, chunk: bytes) -> Behaviour:
    def send(conn: socket.socket, seen: Seen, server: HostileServer) -> None:
        conn.sendall(head)
        while not server.closing.is_set():
            conn.sendall(chunk)
    return send


def reset_after(*parts: bytes) -> Behaviour:
    """Send ``parts``, then a TCP reset (SO_LINGER 0), not a clean close."""
    def send(conn: socket.socket, seen: Seen, server: HostileServer) -> None:
        for part in parts:
            conn.sendall(part)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    return send


def silent(conn: socket.socket, seen: Seen, server: HostileServer) -> None:
    server.sleep(30)


def continue_forever(conn: socket.socket, seen: Seen, server: HostileServer) -> None:
    while True:
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        server.sleep(0.3)


def by_target(**behaviours: Behaviour) -> Behaviour:
    """``item_1=...`` answers /items/1, and so on."""
    def send(conn: socket.socket, seen: Seen, server: HostileServer) -> None:
        behaviours[seen.target.strip("/").replace("/", "_")](conn, seen, server)
    return send


BIG = 50 * 2**20


@dataclass(frozen=True)
class Case:
    behaviour: Behaviour
    expect: str  # in the message
    fields: dict[str, Any] = field(default_factory=dict)
    most_s: float = 1.0  # the time it may take (plus slack): timeout_s, or deadline_s where retries run


SLOW_AND_HUGE: dict[str, Case] = {
    "body dripped a byte per 0.3 s": Case(drip(http(200, b"", {"Content-Length": "100"}, length=False), b"x" * 100),
                                          "no answer within 1 s"),
    "status line dripped": Case(drip(http(200, b"{}"), b"", from_start=True), "no answer within 1 s"),
    "chunked body dripped": Case(drip(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"1\r\nx\r\n" * 50),
                                 "no answer within 1 s"),
    "silence": Case(silent, "no answer within 1 s"),
    "100 Continue for ever": Case(continue_forever, "no answer within 1 s"),
    "50 MB declared": Case(endless(http(200, b"", {"Content-Length": str(BIG)}, length=False), b"z" * 65536),
                           "[truncated: the response is longer than 4096 bytes", most_s=1.0),
    "50 MB declared, oversize=error": Case(endless(http(200, b"", {"Content-Length": str(BIG)}, length=False), b"z" * 65536),
                                          f"the response is {BIG} bytes, over the 4096-byte limit", {"oversize": "error"}),
    "an endless chunked body": Case(endless(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"10000\r\n" + b"q" * 65536 + b"\r\n"),
                                    "[truncated: the response is longer than 4096 bytes"),
    "a gzip bomb (50 MB of zeros)": Case(raw(http(200, gzip.compress(b"0" * BIG), {"Content-Encoding": "gzip"})),
                                         "[truncated: the response is longer than 4096 bytes"),
    "reset mid-body": Case(reset_after(http(200, b"", {"Content-Length": "1000"}, length=False), b"x" * 10),
                           "the request failed"),
    "reset before answering": Case(reset_after(), "the request failed"),
    "redirect off the allowlist": Case(raw(http(302, b"", {"Location": "http://localhost:{other}/items/1"})),
                                       "refused: localhost is not an allowed host"),
    "a redirect with an endless body": Case(by_target(
        items_1=endless(http(302, b"", {"Location": "/items/2"}, length=False), b"r" * 65536),
        items_2=raw(http(200, b"arrived"))), "arrived"),
    "a zstd answer (GBs from a few KB)": Case(raw(http(200, b"(\xb5/\xfd" + b"\x00" * 64, {"Content-Encoding": "zstd"})),
                                              "encoded as 'zstd', which this tool does not read"),
    "gzip twice": Case(raw(http(200, gzip.compress(gzip.compress(b"0" * 2**20)), {"Content-Encoding": "gzip, gzip"})),
                       "encoded as 'gzip, gzip'"),
    "redirect loop": Case(raw(http(307, b"", {"Location": "/items/1"})), "more than 3 redirects"),
    "503 for ever, Retry-After 0.3": Case(raw(http(503, b"down", {"Retry-After": "0.3"})), "HTTP 503",
                                          {"max_retries": 10, "max_retry_after_s": 1.0}, most_s=2.0),
    "429 asking for more than the deadline": Case(raw(http(429, b"", {"Retry-After": "1.5"})), "rate limited: try again in 2 s",
                                                  {"max_retry_after_s": 5.0}, most_s=2.0),
    "HTML claimed as JSON": Case(raw(http(200, b"<html>login</html>", {"Content-Type": "application/json"})), "<html>login</html>"),
    "binary claimed as an image": Case(raw(http(200, PNG, {"Content-Type": "image/png"})),
                                       "[a binary response (image/png, 1032 bytes); this tool returns text only]"),
    "a 500 whose JSON nests 30000 deep": Case(raw(http(500, b"[" * 30_000)), "failed with HTTP 500 Status: [[["),
}


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("case", list(SLOW_AND_HUGE.values()), ids=list(SLOW_AND_HUGE))
def test_a_slow_or_huge_response_ends_within_its_time(servers: tuple[HostileServer, HostileServer], case: Case,
                                                      use_async: bool) -> None:
    api, other = servers
    api.behaviour = case.behaviour
    other.requests.clear()
    message, elapsed = timed_call(hostile_tools(api, **case.fields)["get_item"], {"item_id": "1"}, use_async)
    assert_bounded(message, elapsed)
    assert case.expect in message.content, message.content
    assert elapsed <= case.most_s + SLACK_S, f"{elapsed:.2f} s"
    assert not other.requests  # none reaches the other server (localhost is no allowed host: refused before sending)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_the_credential_goes_to_the_base_origin_only(servers: tuple[HostileServer, HostileServer], use_async: bool) -> None:
    api, other = servers
    api.behaviour = raw(http(307, b"", {"Location": "http://127.0.0.1:{other}/items/1"}))
    other.behaviour = raw(http(200, b'{"ok": true}'))
    api.requests.clear()
    other.requests.clear()
    message, _ = timed_call(hostile_tools(api)["get_item"], {"item_id": "1"}, use_async)
    assert message.status == "success" and api.requests[-1].headers["x-api-key"] == CANARY
    assert [s.target for s in other.requests] == ["/items/1"] and "x-api-key" not in other.requests[0].headers


@pytest.mark.parametrize("name", ["dripped", "huge", "zstd", "redirected", "refused"])
def test_a_hostile_spec_server_ends_in_one_spec_error(name: str, servers: tuple[HostileServer, HostileServer]) -> None:
    api, _ = servers
    api.behaviour = {
        "dripped": drip(http(200, b"", {"Content-Length": "200"}, length=False), json.dumps(SPEC).encode()[:200]),
        "huge": endless(http(200, b"", {"Content-Length": str(BIG)}, length=False), b" " * 65536),
        "zstd": raw(http(200, b"(\xb5/\xfd" + b"\x00" * 64, {"Content-Encoding": "zstd"})),
        "redirected": raw(http(302, b"", {"Location": "https://evil.example/openapi.json"})),
        "refused": reset_after(),
    }[name]
    start = time.monotonic()
    with pytest.raises(SpecError) as error:
        load_spec(f"{api.url}/openapi.json", allow_hosts=["127.0.0.1"], timeout_s=1.0, max_bytes=100_000)
    assert time.monotonic() - start <= 1.0 + SLACK_S and "\n" not in str(error.value)
    assert {"dripped": "no answer within 1 s", "huge": "over 100000 bytes", "zstd": "a possible memory bomb", "redirected": "HTTP 302",
            "refused": "cannot fetch the spec"}[name] in str(error.value)
