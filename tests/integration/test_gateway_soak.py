"""A bounded soak of the gateway on loopback: minutes of steady traffic lose nothing.

Slow tier (``-m slow``). ``SEED_AGENTS_SOAK_S`` sets the length (default 300 s). Real
parts as in the load test (``tests.gateway_procs``): the gateway as the CLI runs it, a
SQLite store, a fake vLLM in its own process, and a busy-loop process on one core.
Sessions of three turns (streamed and not, alternating), a reward and an end run
back to back from 32 concurrent workers until the time is up. The promises checked:
every call was answered or refused with 503 + Retry-After (never a dropped connection),
every answered call is stored exactly once and nothing refused is, every posted reward
and every end is stored, and the gateway's memory and open files stay bounded (measured
after a warm-up, so caches filling once are not mistaken for a leak).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_procs import MODEL, busy_loop, gateway_on_fake_vllm, stop

pytestmark = pytest.mark.slow

SOAK_S = float(os.environ.get("SEED_AGENTS_SOAK_S", "300"))
WORKERS, TURNS = 32, 3
MAX_IN_FLIGHT = 16  # below WORKERS, so refusals happen and are part of what is soaked
RSS_GROWTH_MB = 64  # after warm-up; a leak of one call's objects per call would pass this within minutes


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Tally:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.answered: list[str] = []
        self.rewarded: list[str] = []
        self.ended: list[str] = []
        self.unexpected: list[str] = []


async def post(client: httpx.AsyncClient, url: str, tally: Tally, **kw: Any) -> httpx.Response:
    """One request, retried after Retry-After while the gateway refuses it with 503."""
    while True:
        try:
            r = await client.post(url, **kw)
        except httpx.TransportError as e:
            tally.kinds["dropped"] += 1
            tally.unexpected.append(repr(e))
            raise
        if r.status_code == 503 and r.json().get("error", {}).get("code") == "overloaded":
            tally.kinds["refused"] += 1
            await asyncio.sleep(float(r.headers["retry-after"]))
            continue
        return r


async def streamed(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str],
                   tally: Tally) -> tuple[str, str, dict[str, Any]] | None:
    """A streamed call read to [DONE]: (session id, call id, the assembled message)."""
    while True:
        async with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
            if r.status_code == 503:
                payload = json.loads(await r.aread())
                if payload.get("error", {}).get("code") == "overloaded":
                    tally.kinds["refused"] += 1
                    await asyncio.sleep(float(r.headers["retry-after"]))
                    continue
            if r.status_code != 200:
                tally.unexpected.append(f"stream {r.status_code}: {(await r.aread())[:300]!r}")
                return None
            text, done = "", False
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    delta = json.loads(line[6:])["choices"][0].get("delta", {})
                    text += delta.get("content") or ""
            if not done:
                tally.unexpected.append("a stream ended without [DONE]")
                return None
            return r.headers["x-session-id"], r.headers["x-call-id"], {"role": "assistant", "content": text}


async def one_session(client: httpx.AsyncClient, url: str, n: int, tally: Tally) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"soak session {n}"}]
    sid: str | None = None
    for turn in range(TURNS):
        headers = {"X-Session-Id": sid} if sid else {"X-Task-Key": f"soak-{n % 8}"}
        body = {"model": MODEL, "messages": messages}
        if (n + turn) % 2:
            got = await streamed(client, f"{url}/v1/chat/completions", body, headers, tally)
            if got is None:
                return
            sid, call_id, message = got
        else:
            r = await post(client, f"{url}/v1/chat/completions", tally, json=body, headers=headers)
            if r.status_code != 200:
                tally.unexpected.append(f"chat {r.status_code}: {r.text[:300]}")
                return
            sid, call_id, message = r.headers["x-session-id"], r.headers["x-call-id"], r.json()["choices"][0]["message"]
        tally.answered.append(call_id)
        messages += [message, {"role": "user", "content": "go on"}]
    assert sid is not None
    r = await post(client, f"{url}/v1/sessions/{sid}/reward", tally, json={"value": float(n % 2), "source": "user"})
    if r.status_code != 200:
        tally.unexpected.append(f"reward {r.status_code}: {r.text[:300]}")
        return
    tally.rewarded.append(sid)
    r = await post(client, f"{url}/v1/sessions/{sid}/end", tally)
    if r.status_code != 200:
        tally.unexpected.append(f"end {r.status_code}: {r.text[:300]}")
        return
    tally.ended.append(sid)


async def soak(url: str, seconds: float, tally: Tally, on_warm: Any) -> None:
    deadline = time.monotonic() + seconds
    warm_at = time.monotonic() + seconds * 0.2
    counter = iter(range(10**9))
    limits = httpx.Limits(max_connections=WORKERS, max_keepalive_connections=WORKERS)

    async def worker() -> None:
        nonlocal warm_at
        while time.monotonic() < deadline:
            await one_session(client, url, next(counter), tally)
            if warm_at and time.monotonic() > warm_at:
                warm_at = 0
                on_warm()

    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(worker() for _ in range(WORKERS)))


def stored(db: Path) -> tuple[Counter[str], Counter[str], set[str]]:
    con = sqlite3.connect(db)
    try:
        calls = Counter(cid for (cid,) in con.execute("SELECT call_id FROM calls"))
        rewards = Counter(sid for (sid,) in con.execute("SELECT session_id FROM rewards WHERE source = 'user'"))
        ended = {sid for (sid,) in con.execute("SELECT session_id FROM sessions WHERE ended_at IS NOT NULL")}
    finally:
        con.close()
    return calls, rewards, ended


def test_a_bounded_soak_loses_nothing_and_stays_bounded(tiny_model_dir: str, tmp_path: Path):
    with gateway_on_fake_vllm(tiny_model_dir, tmp_path, "--max-in-flight", str(MAX_IN_FLIGHT),
                              "--default-max-tokens", "8") as (url, db, gw):
        busy = busy_loop(SOAK_S + 60)
        tally, warm = Tally(), {}

        def on_warm() -> None:
            warm.update(rss=rss_mb(gw.pid), fds=open_fds(gw.pid), calls=len(tally.answered))

        try:
            started = time.monotonic()
            asyncio.run(soak(url, SOAK_S, tally, on_warm))
            wall = time.monotonic() - started
        finally:
            stop(busy)
        end_rss, end_fds = rss_mb(gw.pid), open_fds(gw.pid)
        deadline = time.monotonic() + 60  # a streamed call is stored after its last chunk was sent
        while (calls := stored(db))[0] != Counter(tally.answered) and time.monotonic() < deadline:
            time.sleep(0.5)
        calls, rewards, ended = stored(db)
    print(f"soak: {wall:.0f} s, {len(tally.answered)} calls in {len(tally.ended)} sessions, "
          f"{tally.kinds['refused']} refusals, {tally.kinds['dropped']} dropped; gateway RSS {warm.get('rss', 0):.0f} -> "
          f"{end_rss:.0f} MB after {warm.get('calls', 0)} warm-up calls, fds {warm.get('fds')} -> {end_fds}")
    assert tally.unexpected == [] and tally.kinds["dropped"] == 0, tally.unexpected[:5]
    assert len(tally.answered) >= WORKERS * TURNS and warm  # the soak ran past its warm-up
    assert calls == Counter(tally.answered)  # every answered call stored exactly once, nothing refused stored
    assert rewards == Counter(tally.rewarded) and set(tally.ended) <= ended
    assert end_rss - warm["rss"] < RSS_GROWTH_MB, (warm, end_rss)
    assert end_fds <= warm["fds"] + WORKERS, (warm, end_fds)
