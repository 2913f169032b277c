"""The trace store on SQLite (the shared suite), plus what only SQLite and pure code need.

The same suite runs on a real PostgreSQL server in tests/integration/test_store_postgres.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from seed_agents.config import ConfigError
from seed_agents.store import RewardPolicy, RewardRecord, StoreError, TraceStore
from seed_agents.store.schema import calls
from seed_agents.types import LLMCall
from tests.store_suite import StoreSuite, finished_session


class TestSQLiteStore(StoreSuite):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/nested/dir/traces.db"


def test_sqlite_file_is_in_wal_mode_with_its_parent_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "traces.db"
    with TraceStore.open(f"sqlite:///{path}") as store:
        store.create_session("s")
    assert path.exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize(("url", "message"), [
    ("mysql://user@host/db", "unsupported store URL scheme 'mysql'"),
    ("sqlite://", "names no file"),
    ("sqlite:///:memory:", "names no file"),
    ("not a url", "cannot parse store URL"),
    ("postgresql://user:hunter2@127.0.0.1:1/db", "cannot open store postgresql"),
])
def test_bad_urls_give_one_clear_line(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message) as info:
        TraceStore.open(url)
    assert "\n" not in str(info.value) and "hunter2" not in str(info.value)


def test_calls_table_holds_every_llmcall_field() -> None:
    """A field added to LLMCall without a column would be silently dropped by the store."""
    assert set(LLMCall.model_fields) == set(calls.c.keys()) - {"session_id", "seq"}


def _rewards(*pairs: tuple[str, float]) -> list[RewardRecord]:
    return [RewardRecord(reward_id=i, session_id="s", value=v, source=src, turn=None, comment=None, created_at=0.0)
            for i, (src, v) in enumerate(pairs)]


@pytest.mark.parametrize(("policy", "expected"), [
    (RewardPolicy(), 0.0),                                    # user outranks judge and env
    (RewardPolicy(combine="mean"), 0.5),
    (RewardPolicy(combine="last"), 1.0),
    (RewardPolicy(precedence=["verifier"]), 0.4),             # unlisted: env arrived before user
    (RewardPolicy(precedence=["judge", "user"]), 0.9),
    (RewardPolicy(precedence=["verifier"], ignore_unlisted=True), None),
])
def test_reward_policy_resolve(policy: RewardPolicy, expected: float | None) -> None:
    rewards = _rewards(("env", 0.4), ("user", 0.0), ("judge", 0.9), ("user", 1.0))
    assert policy.resolve(rewards) == expected
    assert policy.resolve([]) is None


def test_traces_export_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from seed_agents.app.cli import _parser

    url = f"sqlite:///{tmp_path}/traces.db"
    with TraceStore.open(url) as store:
        finished_session(store, "ok")
        finished_session(store, "open", end=False)
    parser = _parser()
    out = tmp_path / "out.jsonl"
    args = parser.parse_args(["traces", "export", "--store", url, "--out", str(out), "--only-trainable"])
    assert args.func(args) == 0
    assert "exported 1 trainable sessions" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 1
    for argv in (["traces", "export", "--store", "mysql://x/y", "--out", str(out)],
                 ["traces", "export", "--store", url, "--out", str(out), "--precedence", "user", "--combine", "first"]):
        args = parser.parse_args(argv)
        if "mysql" in argv[3]:
            with pytest.raises(ConfigError, match="--store: unsupported store URL scheme"):
                args.func(args)
        else:
            assert args.func(args) == 0


def _old_store_with_one_call(tmp_path, version: int, dropped: tuple[str, ...]):
    """A store as version ``version`` wrote it (its calls table without ``dropped``), holding
    one call, reopened by this code (which migrates it)."""
    import sqlalchemy as sa

    from seed_agents.store import TraceStore
    from seed_agents.types import LLMCall

    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = TraceStore.open(url)
    store.add_call("s1", LLMCall(messages=[], prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.5]))
    store.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for column in dropped:
            conn.execute(sa.text(f"ALTER TABLE calls DROP COLUMN {column}"))
        conn.execute(sa.text(f"UPDATE schema_version SET version = {version}"))
    engine.dispose()
    return url, TraceStore.open(url)


def test_a_version_2_store_gains_calls_complete_and_keeps_its_calls(tmp_path):
    """Migration 3 on a database written before ``LLMCall.complete`` existed."""
    import sqlalchemy as sa

    from seed_agents.store.schema import MIGRATIONS, migrate
    from seed_agents.types import LLMCall

    url, store = _old_store_with_one_call(tmp_path, 2, ("complete", "guided", "prefill_len"))
    (call,) = store.calls("s1")
    assert call.complete and call.completion_ids == [3]
    store.add_call("s1", LLMCall(messages=[], prompt_ids=[1], completion_ids=[4], logprobs=[-1.0], complete=False))
    assert [c.complete for c in store.calls("s1")] == [True, False]
    assert migrate(sa.create_engine(url)) == len(MIGRATIONS) == 7  # 2 -> 3, 4, 5, 6, 7 (gateways)


def test_a_version_5_store_gains_guided_calls_and_keeps_its_calls(tmp_path):
    """Migration 6 on a database written before guided openings existed."""
    from seed_agents.types import LLMCall

    _, store = _old_store_with_one_call(tmp_path, 5, ("guided", "prefill_len"))
    (call,) = store.calls("s1")
    assert not call.guided and call.prefill_len == 0 and call.completion_ids == [3]
    store.add_call("s1", LLMCall(messages=[], prompt_ids=[1, 2, 3], completion_ids=[4], logprobs=[-1.0],
                                 guided=True, prefill_len=2))
    assert [(c.guided, c.prefill_len) for c in store.calls("s1")] == [(False, 0), (True, 2)]
