"""The store may fail; users may not: the gateway's spool during a trace-store outage.

The store is a real SQLite ``TraceStore`` whose methods fail like a stopped server while an
``Outage`` is on (``OperationalError``, as SQLAlchemy raises for a refused connection or a
read-only disk; as root, a read-only file mode would not stop SQLite). The upstream is
``FakeVLLM``. The real PostgreSQL server stopped and restarted mid-traffic is
``tests/integration/test_gateway_store_outage.py``. Waits poll with generous deadlines:
the machine may be loaded.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig
from seed_agents.gateway.spool import Flusher, Spool, SpoolEntry, SpoolError, default_spool_path, is_outage
from seed_agents.gateway.upstream import Upstream
from seed_agents.store import StoreError, TraceStore
from seed_agents.transcript import Transcript
from seed_agents.types import LLMCall

MODEL = "tiny"
SECRET = "sk-live-0123456789abcdefghij"
FAST = {"retry_max_s": 0.2}  # a recovered store is used within a fraction of a second


def down_error() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("INSERT INTO calls ...", None, sqlite3.OperationalError("attempt to write a readonly database"))


class Outage:
    """While ``down``, every store method the gateway's chat path uses fails like a dead server."""

    METHODS = ("add_call", "get_session", "create_session", "flag_session", "merge_session_metadata")

    def __init__(self, store: TraceStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.down = False
        for name in self.METHODS:
            monkeypatch.setattr(store, name, self._guard(getattr(store, name)))

    def _guard(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise down_error()
            return method(*args, **kwargs)

        return guarded


@pytest.fixture
def outage(store, monkeypatch) -> Outage:
    return Outage(store, monkeypatch)


def make_client(fake, store, tokenizer, name: str | None = None, **outage_cfg: Any) -> TestClient:
    cfg = GatewayConfig(upstream="http://fake", model=MODEL, name=name, store_outage={**FAST, **outage_cfg})
    upstream = Upstream("http://fake", MODEL, transport=fake.transport(), retries=0)
    return TestClient(build_app(cfg, store, upstream, tokenizer=tokenizer))


def chat(client: TestClient, content: str = "hi", session: str | None = None, **body: Any):
    headers = {"X-Session-Id": session} if session else {}
    return client.post("/v1/chat/completions", headers=headers,
                       json={"model": MODEL, "messages": [{"role": "user", "content": content}], **body})


def metric(client: TestClient, name: str) -> float:
    """The sample ``name`` in the gateway's /metrics, summed over its labels."""
    samples = [s.value for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples if s.name == name]
    assert samples, f"no {name} in /metrics"
    return sum(samples)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def stored_ids(store: TraceStore, session: str) -> list[str]:
    return [c.call_id for c in store.calls(session)]


# -- spool mode (the default) ----------------------------------------------------------------------


def test_an_outage_is_spooled_answered_and_flushed_exactly_once_in_order(fake, store, tokenizer, outage):
    assert GatewayConfig(upstream="http://u", model="m").store_outage.on_failure == "spool"  # the documented default
    with make_client(fake, store, tokenizer) as c:
        first = chat(c, session="s1")
        assert first.status_code == 200
        outage.down = True
        answered: dict[str, list[str]] = {"s1": [first.headers["x-call-id"]], "s2": []}
        for i in range(3):
            for sid in ("s1", "s2"):
                r = chat(c, f"turn {i}", session=sid, stream=(i == 1))
                assert r.status_code == 200, r.text  # the user is answered, the ended-session check skipped
                if i == 1:
                    assert r.text.rstrip().endswith("data: [DONE]")
                answered[sid].append(r.headers["x-call-id"])
        assert metric(c, "seed_gateway_spooled_calls_total") == 6
        assert metric(c, "seed_gateway_spool_depth") == 6
        assert metric(c, "seed_gateway_spool_flushed_calls_total") == 0

        outage.down = False
        wait_until(lambda: metric(c, "seed_gateway_spool_depth") == 0, "the spool to drain")
        assert metric(c, "seed_gateway_spool_flushed_calls_total") == 6
        assert metric(c, "seed_gateway_calls_total") == 7  # every stored call, direct or flushed
        stats = c.get("/v1/admin/stats").json()
        assert stats["calls_spooled"] == 6 and stats["calls_flushed"] == 6 and stats["calls_stored"] == 7
        assert stored_ids(store, "s1") == answered["s1"] and stored_ids(store, "s2") == answered["s2"]
        assert chat(c, session="s2").status_code == 200  # back to direct writes
        assert len(store.calls("s2")) == 4 and metric(c, "seed_gateway_spooled_calls_total") == 6
    # the transcript came along, written in answer order: the last call's (each sends one user message)
    assert store.get_session("s1").metadata["transcript"]["question"] == "turn 2"


def test_a_session_with_calls_waiting_spools_its_later_calls(fake, store, tokenizer, outage):
    """Order within a session: once the store is back, a session whose earlier calls still
    wait goes on spooling until they are flushed; another session writes directly."""
    with make_client(fake, store, tokenizer) as c:
        spool = c.app.state.gateway.recorder.spool
        flushing = threading.Event()
        flush_step = spool.flush_step

        def gated(*args: Any, **kwargs: Any) -> Any:
            if not flushing.is_set():
                raise down_error()  # the flusher keeps backing off as if the store were still down
            return flush_step(*args, **kwargs)

        spool.flush_step = gated
        outage.down = True
        early = chat(c, "early", session="a").headers["x-call-id"]
        outage.down = False
        spool.store_down = False  # as after a flush that went through
        late = chat(c, "late", session="a").headers["x-call-id"]
        other = chat(c, "other", session="b").headers["x-call-id"]
        assert store.calls("a") == [] and spool.depth == 2 and stored_ids(store, "b") == [other]
        flushing.set()
        wait_until(lambda: spool.depth == 0, "the spool to drain")
        assert stored_ids(store, "a") == [early, late]


def test_calls_left_in_the_spool_are_flushed_by_the_next_gateway(fake, store, tokenizer, outage, tmp_path):
    with make_client(fake, store, tokenizer) as c:
        outage.down = True
        ids = [chat(c, f"q{i}", session="s").headers["x-call-id"] for i in range(3)]
        spool_path = c.app.state.gateway.recorder.spool.path
    # shut down with the store still down: the calls stay on disk
    name = c.app.state.gateway.cfg.gateway_name  # each gateway on a store has its own spool, beside a SQLite store
    assert spool_path == default_spool_path(store.url, name) == tmp_path / f"traces.db.{name.replace(':', '_')}.spool"
    assert _spooled_rows(spool_path) == 3 and store.calls("s") == []

    outage.down = False
    with make_client(fake, store, tokenizer) as c:
        wait_until(lambda: c.app.state.gateway.recorder.spool.depth == 0, "the restarted gateway to flush")
        assert metric(c, "seed_gateway_spool_flushed_calls_total") == 3
    assert stored_ids(store, "s") == ids and _spooled_rows(spool_path) == 0


def test_two_gateways_on_one_store_each_drain_their_own_spool_once(fake, store, tokenizer, outage):
    one, two = (make_client(fake, store, tokenizer, name=n) for n in ("gw-a", "gw-b"))
    with one as a, two as b:  # both run at once: a shared spool file would refuse the second
        outage.down = True
        ids = {"a": chat(a, "from a", session="s").headers["x-call-id"],
               "b": chat(b, "from b", session="t").headers["x-call-id"]}
        paths = {a.app.state.gateway.recorder.spool.path, b.app.state.gateway.recorder.spool.path}
        outage.down = False
        wait_until(lambda: not (a.app.state.gateway.recorder.spool.depth or b.app.state.gateway.recorder.spool.depth),
                   "both spools to drain")
        assert metric(a, "seed_gateway_spool_flushed_calls_total") == metric(b, "seed_gateway_spool_flushed_calls_total") == 1
    assert len(paths) == 2 and stored_ids(store, "s") == [ids["a"]] and stored_ids(store, "t") == [ids["b"]]
    assert {g.name for g in store.gateways()} == {"gw-a", "gw-b"}  # `status` sees both


def test_a_spool_left_at_the_unnamed_default_is_taken_over_and_flushed(fake, store, tokenizer, outage):
    unnamed = default_spool_path(store.url)
    with make_client(fake, store, tokenizer, spool_path=str(unnamed)) as c:  # as a gateway before named spools
        outage.down = True
        call_id = chat(c, session="old").headers["x-call-id"]
    outage.down = False
    with make_client(fake, store, tokenizer, name="gw-new") as c:
        wait_until(lambda: c.app.state.gateway.recorder.spool.depth == 0, "the taken-over spool to drain")
        assert c.app.state.gateway.recorder.spool.path == default_spool_path(store.url, "gw-new")
    assert stored_ids(store, "old") == [call_id] and not unnamed.exists()


def test_shutdown_tries_one_last_flush(fake, store, tokenizer, outage, monkeypatch):
    async def idle(self: Flusher) -> None:  # a flusher that never gets to it: only the shutdown flush can
        await asyncio.Event().wait()

    monkeypatch.setattr(Flusher, "run", idle)
    with make_client(fake, store, tokenizer) as c:
        outage.down = True
        ids = [chat(c, f"q{i}", session="s").headers["x-call-id"] for i in range(2)]
        outage.down = False
        assert store.calls("s") == []
    assert stored_ids(store, "s") == ids


def test_the_spool_holds_redacted_calls_only_in_a_private_file(fake, store, tokenizer, outage):
    with make_client(fake, store, tokenizer) as c:
        outage.down = True
        r = chat(c, f"my key is {SECRET}", session="leaky")
        assert r.status_code == 200
        path = c.app.state.gateway.recorder.spool.path
        for f in [path, *path.parent.glob(path.name + "-*")]:  # the -wal / -shm files too
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
            assert SECRET.encode() not in f.read_bytes(), f
        outage.down = False
        wait_until(lambda: c.app.state.gateway.recorder.spool.depth == 0, "the spool to drain")
    session = store.get_session("leaky")
    assert session.flagged_reason == "secret" and SECRET not in json.dumps([x.model_dump() for x in store.calls("leaky")])


def test_a_full_spool_refuses_with_503(fake, store, tokenizer, outage):
    with make_client(fake, store, tokenizer, max_spool_mb=1e-6) as c:
        outage.down = True
        r = chat(c)
        assert r.status_code == 503 and r.json()["error"]["code"] == "spool_unavailable"
        assert c.get("/v1/admin/stats").json()["spool_errors"] == 1


def test_a_store_error_no_wait_cures_is_still_a_503(fake, store, tokenizer, monkeypatch):
    def refused(*a: Any, **k: Any) -> Any:
        raise StoreError("call ids must be unique across sessions")

    with make_client(fake, store, tokenizer) as c:
        monkeypatch.setattr(store, "add_call", refused)
        r = chat(c)
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_error"
        assert c.app.state.gateway.recorder.spool.depth == 0


# -- refuse mode ----------------------------------------------------------------------------------------


def test_refuse_mode_answers_503_and_records_nothing(fake, store, tokenizer, outage, tmp_path):
    with make_client(fake, store, tokenizer, on_failure="refuse") as c:
        outage.down = True
        r = chat(c, session="s")
        assert r.status_code == 503
        error = r.json()["error"]
        assert set(error) == {"message", "type", "code"} and error["code"] == "store_error"
        assert error["type"] == "store_unavailable"
        outage.down = False
        assert store.get_session("s") is None and c.app.state.gateway.recorder.spool is None
    assert not default_spool_path(store.url).exists()


# -- the spool itself --------------------------------------------------------------------------------------


def entry(session: str = "s", **call: Any) -> SpoolEntry:
    fields = {"messages": [{"role": "user", "content": "hi"}], "prompt_ids": [1, 2], "completion_ids": [3], "logprobs": [-0.5], **call}
    return SpoolEntry(session_id=session, task_key=None, call=LLMCall(**fields), flagged=False, transcript=Transcript(question="hi"))


@pytest.fixture
def spool(tmp_path, store) -> Iterator[Spool]:
    s = Spool.open(tmp_path / "spool.sqlite", store.url, 1 << 20)
    yield s
    s.close()


def test_an_entry_round_trips_as_the_store_would_write_it():
    e = entry(completion_ids=[3, 4], logprobs=[float("-inf"), 0.1 + 0.2])
    assert SpoolEntry.loads(e.dumps()) == e


def test_a_write_that_reached_the_store_before_a_crash_is_not_stored_twice(spool, store):
    """Store commit, then a crash before the entry was deleted: the flush writes it again, harmlessly."""
    e = entry()
    spool.append(e)
    store.add_call(e.session_id, e.call)  # what the crashed flush had done
    step = spool.flush_step(lambda x: store.add_call(x.session_id, x.call))
    assert [x.call.call_id for x in step.flushed] == [e.call.call_id] and spool.depth == 0
    assert stored_ids(store, "s") == [e.call.call_id]


def test_an_outage_stops_the_step_and_a_refused_entry_is_set_aside(spool):
    for session in ("a", "b", "c"):
        spool.append(entry(session))
    unreachable = {"a", "c"}  # sessions whose write meets the outage
    written: list[str] = []

    def write(e: SpoolEntry) -> None:
        if e.session_id == "b":
            raise StoreError("refused for good")
        if e.session_id in unreachable:
            raise down_error()
        written.append(e.session_id)

    with pytest.raises(sa.exc.OperationalError):
        spool.flush_step(write)  # nothing went through: the outage is raised, for the flusher to back off
    unreachable.discard("a")
    step = spool.flush_step(write)  # a, then b refused for good, then c meets the outage: the step stops there
    assert [e.session_id for e in step.flushed] == ["a"] and step.rejected == 1 and spool.depth == 1
    assert spool.holds("c") and not spool.holds("b")
    unreachable.clear()
    step = spool.flush_step(write)
    assert [e.session_id for e in step.flushed] == ["c"] and spool.depth == 0 and written == ["a", "c"]
    rows = sqlite3.connect(spool.path).execute("SELECT session_id, rejected FROM entries").fetchall()
    assert rows == [("b", "refused for good")]  # kept for an operator, out of the queue


def test_one_gateway_per_spool_and_one_store_per_spool(store, tmp_path):
    path = tmp_path / "spool.sqlite"
    spool = Spool.open(path, store.url, 1 << 20)
    with pytest.raises(SpoolError, match="in use"):
        Spool.open(path, store.url, 1 << 20)
    spool.append(entry())
    spool.close()
    with pytest.raises(SpoolError, match="holds 1 calls for the store"):
        Spool.open(path, "sqlite:////elsewhere/traces.db", 1 << 20)
    reopened = Spool.open(path, store.url, 1 << 20)
    assert reopened.depth == 1 and reopened.holds("s")
    reopened.close()


def test_what_counts_as_an_outage():
    assert is_outage(down_error())
    assert is_outage(sa.exc.InterfaceError("SELECT 1", None, Exception("connection already closed")))
    locked = StoreError("the store stayed locked")
    locked.__cause__ = down_error()
    assert is_outage(locked)
    assert not is_outage(StoreError("call ids must be unique across sessions"))
    assert not is_outage(sa.exc.IntegrityError("INSERT", None, Exception("UNIQUE constraint failed")))


def _spooled_rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM entries WHERE rejected IS NULL").fetchone()[0]
