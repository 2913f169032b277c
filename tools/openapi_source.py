"""Reading an OpenAPI document: from a dict, a file or a URL, bounded, into plain data.

The first half of ``seed_agents.tools.openapi_spec`` (which checks the document's shape and
builds operations from it), kept apart because it is about bytes and sockets, not about
OpenAPI: a spec is input and can be hostile (gigabytes, a server that drips it a byte at a
time, a YAML alias bomb, nesting past the recursion limit), and every such input ends in
one ``SpecError`` within ``timeout_s``, never another exception and never a hang.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import yaml

from seed_agents.errors import UserError
from seed_agents.http import bounded_encoding, run_blocking, tls_context

Transport = httpx.BaseTransport | httpx.AsyncBaseTransport

MAX_SPEC_BYTES = 16 * 2**20
"""Largest spec read from a file or URL (a large real API, GitHub's, is about 11 MB of JSON)."""
MAX_SPEC_NODES = 1_000_000
"""Most values (objects, lists, scalars) a spec may hold, counted as a tree: YAML aliases can
expand a small file into a huge or cyclic document, and every tool built walks it."""

class SpecError(UserError, ValueError):
    """A spec that cannot become tools: unreadable, not OpenAPI 3, malformed where the tools
    read it, too big, or at odds with the config. The message is one line (whitespace from
    the spec's own names is folded, long ones are cut) naming the place and the problem."""

    def __init__(self, message: str) -> None:
        line = " ".join(message.split())
        super().__init__(line if len(line) <= 500 else line[:497] + "...")


def read_spec(source: dict[str, Any] | str | Path, *, allow_hosts: Sequence[str] = (), transport: Transport | None = None,
              timeout_s: float = 10.0, max_bytes: int = MAX_SPEC_BYTES) -> dict[str, Any]:
    """The parsed document from a dict, a file (JSON or YAML) or an http(s) URL whose host
    is in ``allow_hosts``, fetched within ``timeout_s`` in all (redirects are not followed),
    bounded in bytes and values. Raises ``SpecError`` when it cannot be read."""
    if isinstance(source, dict):
        spec: Any = source
    elif str(source).startswith(("http://", "https://")):
        try:
            url = httpx.URL(str(source))
        except httpx.InvalidURL as e:
            raise SpecError(f"the spec URL {str(source)[:200]!r} is invalid: {e}") from None
        if url.host.lower() not in {h.lower() for h in allow_hosts}:
            raise SpecError(f"the spec URL's host {url.host!r} is not in allow_hosts {list(allow_hosts)}")
        spec = _parse(_fetch(url, transport, timeout_s, max_bytes), str(url))
    else:
        try:
            with open(source, "rb") as f:
                data = f.read(max_bytes + 1)
        except (OSError, ValueError) as e:  # ValueError: a path holding a NUL byte
            raise SpecError(f"cannot read the spec {str(source)[:200]}: {getattr(e, 'strerror', None) or e}") from None
        _cap(len(data), max_bytes, source)
        spec = _parse(data, str(source))
    _check_size(spec, where_of(source))
    return spec


def where_of(source: dict[str, Any] | str | Path) -> str:
    """How a message names the spec."""
    return "the spec" if isinstance(source, dict) else str(source)[:200]


def _fetch(url: httpx.URL, transport: Transport | None, timeout_s: float, max_bytes: int) -> bytes:
    """The spec's bytes. An in-process sync transport answers for itself; anything that
    reaches a socket runs on the async engine, where ``timeout_s`` bounds the whole fetch
    (httpx's own timeouts apply per read, so a drip would never end: see ``run_blocking``)."""
    try:
        if isinstance(transport, httpx.BaseTransport):
            with (httpx.Client(transport=transport, timeout=timeout_s, headers=_IDENTITY) as client,
                  client.stream("GET", url) as response):
                _raise_for_status(response)
                data = bytearray()
                for chunk in response.iter_bytes():
                    data += chunk
                    _cap(len(data), max_bytes, url)
                return bytes(data)
        return run_blocking(_afetch, url, transport, timeout_s, max_bytes)
    except (httpx.HTTPError, TimeoutError) as e:
        why = f"no answer within {timeout_s:g} s" if isinstance(e, TimeoutError | httpx.TimeoutException) else type(e).__name__
        raise SpecError(f"cannot fetch the spec from {url}: {why}") from None


async def _afetch(url: httpx.URL, transport: httpx.AsyncBaseTransport | None, timeout_s: float, max_bytes: int) -> bytes:
    with anyio.fail_after(timeout_s):
        async with (httpx.AsyncClient(transport=transport, timeout=timeout_s, verify=tls_context(), headers=_IDENTITY) as client,
                    client.stream("GET", url) as response):
            _raise_for_status(response)
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                _cap(len(data), max_bytes, url)
            return bytes(data)


_IDENTITY = {"Accept-Encoding": "identity"}  # see seed_agents.http.bounded_encoding


def _raise_for_status(response: httpx.Response) -> None:
    if not response.is_success:  # a redirect too: the spec's own host is the only one asked
        raise SpecError(f"cannot fetch the spec from {response.url}: HTTP {response.status_code} {response.reason_phrase}")
    if not bounded_encoding(response.headers.get("content-encoding")):
        raise SpecError(f"cannot fetch the spec from {response.url}: it came encoded as "
                        f"{response.headers['content-encoding'][:60]!r} (a possible memory bomb), not uncompressed as asked")


def _cap(size: int, max_bytes: int, where: Any) -> None:
    if size > max_bytes:
        raise SpecError(f"the spec {where} is over {max_bytes} bytes")


def _parse(data: bytes, where: str) -> Any:
    """JSON (fast, in C) or else YAML (a superset), with libyaml where it is installed."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecError(f"the spec {where} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except ValueError:
        pass
    except RecursionError:
        raise SpecError(f"the spec {where} nests too deeply") from None
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # safe: plain data only
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise SpecError(f"the spec {where} is neither JSON nor YAML{at}: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise SpecError(f"the spec {where} nests too deeply") from None


def _check_size(spec: Any, where: str) -> None:
    """At most ``MAX_SPEC_NODES`` values, counted as a tree (so an alias bomb or a cycle stops)."""
    stack, count = [spec], 1
    while stack:
        node = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        count += len(children)
        if count > MAX_SPEC_NODES:
            raise SpecError(f"{where} holds more than {MAX_SPEC_NODES} values (or refers to itself through YAML aliases)")
        stack.extend(children)


