"""Admission under load: beyond max_in_flight the gateway answers 503 + Retry-After, stores nothing.

The upstream is the fake vLLM behind a gate the test holds shut, so "in flight" is exact
rather than a race: the first ``limit`` chats wait upstream, the next one is refused.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig
from seed_agents.gateway.testing import FakeVLLM
from seed_agents.gateway.upstream import Upstream

MODEL = "tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


class Gate:
    """An ASGI wrapper that holds every request until ``open`` is set."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.open = asyncio.Event()
        self.waiting = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.waiting += 1
            await self.open.wait()
        await self.app(scope, receive, send)


def test_beyond_max_in_flight_is_503_with_retry_after_and_stores_nothing(tokenizer, store):
    async def run() -> None:
        gate = Gate(FakeVLLM(tokenizer, model=MODEL).app)
        upstream = Upstream("http://fake", MODEL, transport=httpx.ASGITransport(app=gate), retries=0)
        app = build_app(GatewayConfig(upstream="http://fake", model=MODEL, max_in_flight=2), store, upstream, tokenizer=tokenizer)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            held = [asyncio.create_task(c.post("/v1/chat/completions", json=CHAT, headers={"X-Session-Id": f"held-{i}"}))
                    for i in range(2)]
            while gate.waiting < 2:
                await asyncio.sleep(0.01)
            try:  # answered at once, not queued behind the gate
                refused = await asyncio.wait_for(c.post("/v1/chat/completions", json=CHAT, headers={"X-Session-Id": "refused"}), 30)
            finally:
                gate.open.set()
            health = await c.get("/health")
            gate.open.set()
            answered = await asyncio.gather(*held)
            after = await c.post("/v1/chat/completions", json=CHAT, headers={"X-Session-Id": "after"})
            stats = (await c.get("/v1/admin/stats")).json()
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "overloaded" and refused.json()["error"]["type"] == "server_error"
        assert health.status_code == 200  # liveness is never refused
        assert [r.status_code for r in answered] == [200, 200] and after.status_code == 200  # the slots came back
        assert store.get_session("refused") is None
        assert {s: len(store.calls(s)) for s in ("held-0", "held-1", "after")} == {"held-0": 1, "held-1": 1, "after": 1}
        assert stats["http_503_overloaded"] == 1

    asyncio.run(run())


def test_a_connection_closed_before_any_reply_is_retried_upstream(tokenizer):
    """A pooled connection the upstream shut as it was reused: ReadError, no reply; ask again."""
    from seed_agents.types import SamplingParams

    fake = FakeVLLM(tokenizer, model=MODEL)
    inner = fake.transport()
    failures = [httpx.ReadError(""), httpx.RemoteProtocolError("Server disconnected without sending a response.")]

    class Flaky(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if failures:
                raise failures.pop(0)
            return await inner.handle_async_request(request)

    async def run() -> Any:
        upstream = Upstream("http://fake", MODEL, transport=Flaky(), retries=2)
        try:
            return await upstream.complete(MODEL, [1, 2, 3], SamplingParams(max_tokens=4), 0)
        finally:
            await upstream.aclose()

    comp = asyncio.run(run())
    assert comp.token_ids and failures == [] and len(fake.requests) == 1
