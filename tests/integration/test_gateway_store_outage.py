"""The store may fail; users may not: the gateway with its real PostgreSQL store stopped mid-traffic.

Clients keep chatting (several sessions at once, streams among them) while the PostgreSQL
server is stopped (``pg_ctl stop -m immediate``: connections cut mid-transaction, new ones
refused) and restarted. Every request must be answered 200, the spooled calls must reach
the store once it is back, and the store must then hold every answered call exactly once,
each session's calls in the order they were answered. The server here is this module's
own (stopping the session-wide one would break other tests); see tests/pg_fixture.py for
how it runs. The gateway is in-process (``TestClient``, its lifespan runs the flusher);
the upstream is ``FakeVLLM``. Waits poll with generous deadlines: the machine may be loaded.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Self

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig
from seed_agents.gateway.testing import FakeVLLM
from seed_agents.gateway.upstream import Upstream
from seed_agents.store import TraceStore
from tests.pg_fixture import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.integration

MODEL = "tiny"
SESSIONS = 4


class StoppablePostgres(PostgresServer):
    """A throwaway server that a test may stop (as a crash: ``-m immediate``) and start again."""

    def new_durable_database(self) -> str:
        """A database whose acknowledged commits survive the crash: the server runs with
        ``synchronous_commit=off`` for speed, under which a crash forgets the last commits
        it acknowledged, which no client could make up for."""
        import psycopg

        url = self.new_database()
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" SET synchronous_commit = on')
        return url

    def halt(self) -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")

    def resume(self) -> None:
        # restart on a stopped server starts it with the options of its last start (postmaster.opts)
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "restart")


@pytest.fixture(scope="module")
def pg() -> Iterator[StoppablePostgres]:
    server = StoppablePostgres(postgres_bin_dir())
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake(tiny_model_dir: str) -> FakeVLLM:
    from transformers import AutoTokenizer

    return FakeVLLM(AutoTokenizer.from_pretrained(tiny_model_dir), model=MODEL)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def metric(client: TestClient, name: str) -> float:
    samples = [s.value for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples if s.name == name]
    assert samples, f"no {name} in /metrics"
    return sum(samples)


class Traffic:
    """One thread per session, each chatting turn after turn until ``stop``; every answer is kept."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.answered: dict[str, list[str]] = {f"user-{i}": [] for i in range(SESSIONS)}
        self.outcomes: Counter[str] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._chat, args=(sid,), daemon=True) for sid in self.answered]

    @property
    def total(self) -> int:
        with self._lock:
            return sum(len(ids) for ids in self.answered.values())

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Let each client finish its turn in flight, then stop."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def _chat(self, sid: str) -> None:
        turn = 0
        while not self._stop.is_set():
            r = self.client.post("/v1/chat/completions", headers={"X-Session-Id": sid},
                                 json={"model": MODEL, "messages": [{"role": "user", "content": f"{sid} turn {turn}"}],
                                       "stream": turn % 3 == 2})
            stream_failed = turn % 3 == 2 and not r.text.rstrip().endswith("data: [DONE]")  # an error event instead
            with self._lock:
                self.outcomes["stream error" if r.status_code == 200 and stream_failed else str(r.status_code)] += 1
                if r.status_code == 200 and not stream_failed:
                    self.answered[sid].append(r.headers["x-call-id"])
            turn += 1


def test_postgres_stopped_mid_traffic_every_answered_call_is_stored_exactly_once(pg, fake, tmp_path):
    url = pg.new_durable_database()
    store = TraceStore.open(url)
    cfg = GatewayConfig(upstream="http://fake", model=MODEL, store=url,
                        store_outage={"spool_path": str(tmp_path / "spool.sqlite"), "retry_max_s": 0.5})
    upstream = Upstream("http://fake", MODEL, transport=fake.transport(), retries=0)
    try:
        with TestClient(build_app(cfg, store, upstream, tokenizer=fake.tokenizer)) as client, Traffic(client) as traffic:
            wait_until(lambda: traffic.total >= 8, "traffic before the outage")
            pg.halt()
            during = traffic.total
            wait_until(lambda: metric(client, "seed_gateway_spooled_calls_total") >= 12, "calls spooled during the outage")
            # users kept being answered while the store was down: waited for, not read once (calls
            # answered before the halt and not yet written are spooled too, so the spool count can
            # pass 12 before any client's next turn has come back on a loaded machine: CI saw 20 > 20)
            wait_until(lambda: traffic.total >= during + 8, "answers during the outage")
            pg.resume()
            wait_until(lambda: metric(client, "seed_gateway_spool_flushed_calls_total") >= 12, "the flush after recovery")
            after = traffic.total
            wait_until(lambda: traffic.total >= after + 8, "traffic after the recovery")
            traffic.stop()  # then let the spool drain
            wait_until(lambda: metric(client, "seed_gateway_spool_depth") == 0, "the spool to drain")
            spooled = metric(client, "seed_gateway_spooled_calls_total")
            assert metric(client, "seed_gateway_spool_flushed_calls_total") == spooled
            assert metric(client, "seed_gateway_calls_total") == traffic.total
        assert set(traffic.outcomes) == {"200"}, traffic.outcomes  # no user was refused
        for sid, ids in traffic.answered.items():
            stored = [c.call_id for c in store.calls(sid)]
            assert stored == ids, sid  # each answered call once, in answer order, and nothing else
    finally:
        store.close()
