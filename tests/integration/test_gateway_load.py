"""The gateway under load on loopback: answered or refused with a status, never a dropped connection.

Real parts: the gateway as the CLI runs it (``python -m seed_agents.gateway``: uvicorn, its
keep-alive setting, the in-flight limit), a SQLite store, and the fake vLLM served by
uvicorn in its own process (no model: the gateway's own work is what is loaded). A
busy-loop process competes for the CPU meanwhile, as on a shared 2-core machine.

Why a connection was dropped before (1 of 256 calls, ``httpx.ReadError('')``): uvicorn
closed idle connections after 5 s, exactly httpx's pool expiry, and the client's idle clock
starts after the server's, so a pooled connection could be reused just as the server shut
it. The gateway now keeps idle connections ``keep_alive_s`` (75 s) and refuses, with 503 and
Retry-After, what it cannot take (``max_in_flight``).
"""

from __future__ import annotations

import asyncio
import http.client
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_procs import MODEL, busy_loop, gateway_on_fake_vllm, stop

SESSIONS, TURNS = 128, 3
MAX_IN_FLIGHT = 24  # small, so that 128 concurrent sessions do meet the limit


@pytest.fixture(scope="module")
def gateway(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    work = tmp_path_factory.mktemp("gateway-load")
    with gateway_on_fake_vllm(tiny_model_dir, work, "--max-in-flight", str(MAX_IN_FLIGHT), "--default-max-tokens", "8") as (url, db, _):
        yield url, db


def test_an_idle_connection_outlives_the_clients_pool_expiry(gateway):
    """httpx reuses a pooled connection for 5 s; the gateway must not close it first."""
    url, _ = gateway
    con = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=10)
    try:
        con.request("GET", "/health")
        assert con.getresponse().read() == b'{"status":"ok"}'
        sock = con.sock
        time.sleep(6.0)  # longer than httpx's keepalive_expiry (5 s) and uvicorn's default keep-alive (5 s)
        con.request("GET", "/health")  # on the same socket: raises RemoteDisconnected if the gateway closed it
        assert con.getresponse().status == 200 and con.sock is sock
    finally:
        con.close()


async def session(client: httpx.AsyncClient, url: str, sid: str, log: list[tuple[str, Any]]) -> None:
    """TURNS chat calls; a 503 is retried after its Retry-After (as the OpenAI SDK does)."""
    messages = [{"role": "user", "content": f"hello from {sid}"}]
    for _ in range(TURNS):
        while True:
            try:
                r = await client.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": messages},
                                      headers={"X-Session-Id": sid})
            except httpx.TransportError as e:
                log.append(("dropped", repr(e)))
                raise
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "overloaded", r.text
                log.append(("refused", sid))
                await asyncio.sleep(float(r.headers["retry-after"]))
                continue
            assert r.status_code == 200, r.text
            log.append(("answered", r.headers["x-call-id"]))
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
            break


async def load(url: str, log: list[tuple[str, Any]]) -> list[BaseException]:
    limits = httpx.Limits(max_connections=SESSIONS, max_keepalive_connections=SESSIONS)  # default 5 s keep-alive expiry
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        results = await asyncio.gather(*(session(client, url, f"load-{i:03d}", log) for i in range(SESSIONS)),
                                       return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]


def test_128_concurrent_sessions_on_a_busy_cpu_are_answered_or_refused_never_dropped(gateway):
    url, db = gateway
    busy = busy_loop(300)  # bounded, and stopped below
    log: list[tuple[str, Any]] = []
    try:
        started = time.perf_counter()
        errors = asyncio.run(load(url, log))
        wall = time.perf_counter() - started
    finally:
        stop(busy)
    kinds = Counter(kind for kind, _ in log)
    assert errors == [] and kinds["dropped"] == 0, errors[:3]
    assert kinds["refused"] > 0  # the in-flight limit was met, and answered with 503 + Retry-After
    answered = [cid for kind, cid in log if kind == "answered"]
    assert len(answered) == SESSIONS * TURNS
    con = sqlite3.connect(db)
    try:
        stored = Counter(cid for (cid,) in con.execute("SELECT call_id FROM calls WHERE session_id LIKE 'load-%'"))
    finally:
        con.close()
    assert stored == Counter(answered)  # every answered call stored exactly once, refused ones not at all
    print(f"load: {len(answered)} calls from {SESSIONS} concurrent sessions in {wall:.1f} s with a busy-loop process; "
          f"{kinds['refused']} refusals (503 + Retry-After, max_in_flight {MAX_IN_FLIGHT}), 0 dropped")
