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
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

MODEL = "tiny"
SESSIONS, TURNS = 128, 3
MAX_IN_FLIGHT = 24  # small, so that 128 concurrent sessions do meet the limit

FAKE_UPSTREAM = """
import sys, uvicorn
from transformers import AutoTokenizer
from seed_agents.gateway.testing import FakeVLLM
uvicorn.run(FakeVLLM(AutoTokenizer.from_pretrained(sys.argv[1]), model="tiny").app,
            host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""
BUSY_LOOP = "import time\nend = time.monotonic() + float(__import__('sys').argv[1])\nwhile time.monotonic() < end: pass"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen[bytes], log: Path, path: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not up: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def gateway(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    work = tmp_path_factory.mktemp("gateway-load")
    up_port, gw_port = free_port(), free_port()
    procs = []
    try:
        with open(work / "upstream.log", "ab") as log:
            procs.append(up := subprocess.Popen([sys.executable, "-c", FAKE_UPSTREAM, tiny_model_dir, str(up_port)],
                                                stdout=log, stderr=subprocess.STDOUT))
        wait_up(f"http://127.0.0.1:{up_port}", up, work / "upstream.log", "/v1/models")
        db = work / "traces.db"
        with open(work / "gateway.log", "ab") as log:
            procs.append(gw := subprocess.Popen(
                [sys.executable, "-m", "seed_agents.gateway", "--upstream", f"http://127.0.0.1:{up_port}", "--model", MODEL,
                 "--tokenizer", tiny_model_dir, "--store", f"sqlite:///{db}", "--port", str(gw_port),
                 "--max-in-flight", str(MAX_IN_FLIGHT), "--default-max-tokens", "8"],
                stdout=log, stderr=subprocess.STDOUT, cwd=work))
        wait_up(f"http://127.0.0.1:{gw_port}", gw, work / "gateway.log", "/health")
        yield f"http://127.0.0.1:{gw_port}", db
    finally:
        for p in reversed(procs):
            stop(p)


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
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, "300"])  # bounded, and stopped below
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
