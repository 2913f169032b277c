"""The trace-store suite every database backend must pass.

Subclass ``StoreSuite`` in a test module and provide one fixture, ``store_url``: the URL
of an empty store (a fresh SQLite file, a fresh PostgreSQL database). The same tests
then hold on both backends: exact round-trips, idempotent retries, reward precedence,
exactly-once claims under racing threads, migrations, and a writer killed with SIGKILL.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from seed_agents.capture import capture, read_jsonl, record_call
from seed_agents.continual import CanaryEpisode, CanaryResult, EpisodeTrace, GateDecision, VersionRegistry, decide
from seed_agents.continual.canary import ToolCallTrace
from seed_agents.store import RewardPolicy, StoreError, StoreSink, TraceStore, export_trajectories, schema
from seed_agents.store._engine import create_engine, parse_url
from seed_agents.types import FaultKind, LLMCall, SamplingParams, Skill, StopReason, Trajectory

REPO_ROOT = Path(__file__).resolve().parents[1]


def make_call(i: int, **overrides: object) -> LLMCall:
    """A call whose every field differs from the defaults, so a dropped column shows."""
    fields: dict[str, object] = dict(
        call_id=f"call-{i:05d}",
        messages=[{"role": "system", "content": "You play a game."},
                  {"role": "user", "content": f"turn {i}: go north? ünïcode ✓"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "tc1", "type": "function", "function": {"name": "move", "arguments": '{"dir": "n"}'}}]}],
        tools=[{"type": "function", "function": {"name": "move", "description": "Move.",
                                                 "parameters": {"type": "object", "properties": {"dir": {"type": "string"}}}}}],
        prompt_ids=[1, 50_000 + i, 151_643, 0, i],
        completion_ids=[7, 8, 9, 2],
        logprobs=[-0.1, -1e-300, -1 / 3 - i, -12.345678901234567],
        text=f"go north {i}",
        policy_version=3,
        purpose="analyzer",
        finish_reason="length",
        latency_s=0.125 + i,
        started_at=1_700_000_000.123456 + i,
        sampling=SamplingParams(max_tokens=7, temperature=0.7, top_p=0.9, seed=5, stop_token_ids=(2, 3)),
        scope={"run": "r1", "task_id": "t", "sample_index": 2},
    )
    fields.update(overrides)
    return LLMCall.model_validate(fields)


def small_call(call_id: str) -> LLMCall:
    return LLMCall(call_id=call_id, messages=[{"role": "user", "content": call_id}], prompt_ids=[1, 2],
                   completion_ids=[3], logprobs=[-0.5])


def finished_session(store: TraceStore, sid: str, *, reward: float | None = 1.0, end: bool = True,
                     calls: int = 1, task_key: str | None = "task-a") -> str:
    store.create_session(sid, task_key=task_key)
    for j in range(calls):
        store.add_call(sid, small_call(f"{sid}-c{j}"))
    if reward is not None:
        store.add_reward(sid, reward, source="user")
    if end:
        store.end_session(sid)
    return sid


def run_threads(n: int, target, *args: object) -> None:
    """Start ``n`` threads on ``target(index, barrier, *args)`` and re-raise their first error."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            target(i, barrier, *args)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


# The writer killed by test_kill_9_loses_no_finished_call: deterministic calls, so every
# stored row can be checked field by field against what was meant to be written.
WRITER = textwrap.dedent("""
    import itertools, sys
    from seed_agents.store import TraceStore
    from seed_agents.types import LLMCall

    def call(i):
        n = 1 + (i * 37) % 400
        return LLMCall(call_id=f"k{i:06d}", messages=[{"role": "user", "content": "x" * n}],
                       prompt_ids=list(range(n)), completion_ids=list(range(i, i + 64)),
                       logprobs=[-(j + 1) / 7 for j in range(64)], text=str(i) * 8)

    if __name__ == "__main__":
        store = TraceStore.open(sys.argv[1])
        stop = int(sys.argv[2])
        for i in (itertools.count() if stop < 0 else range(stop)):
            store.add_call(f"s{i % 3}", call(i))
            if i == 10:
                print("ready", flush=True)
""")


# Two of these promote their own versions over and over at the same time: the decision
# history must come out as one chain (each switch starts where the previous one ended).
PROMOTER = textwrap.dedent("""
    import sys
    from seed_agents.continual import VersionRegistry
    from seed_agents.store import TraceStore

    if __name__ == "__main__":
        registry = VersionRegistry(TraceStore.open(sys.argv[1]))
        versions = [int(v) for v in sys.argv[2].split(",")]
        print("ready", flush=True)
        sys.stdin.readline()  # start together
        for v in versions * 10:
            registry.promote_manually("policy", v, actor="process-" + sys.argv[2])
""")

# Killed by its own hand inside the promotion's transaction, after both status updates
# and the decision row were written but before the commit.
KILLED_PROMOTER = textwrap.dedent("""
    import os, signal, sys
    from seed_agents.continual import VersionRegistry
    from seed_agents.store import TraceStore
    from seed_agents.store import versions as versions_module

    real_set_status = versions_module._set_status

    def set_status_then_die(conn, name, version, status, note, now):
        real_set_status(conn, name, version, status, note, now)
        if status == "promoted":
            os.kill(os.getpid(), signal.SIGKILL)

    if __name__ == "__main__":
        versions_module._set_status = set_status_then_die
        VersionRegistry(TraceStore.open(sys.argv[1])).promote_manually("policy", 2)
""")


def promote_verdict() -> GateDecision:
    """A real gate decision that promotes: an identical copy on 8 tasks."""
    results = [CanaryResult(task_id=f"t{i}", seed=0, reward=float(i % 2)) for i in range(8)]
    decision = decide(results, results)
    assert decision.promote
    return decision


class StoreSuite:
    """Backend-agnostic store tests; subclasses supply the ``store_url`` fixture."""

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[TraceStore]:
        with TraceStore.open(store_url) as store:
            yield store

    # ------------------------------------------------------------------ calls

    def test_call_round_trips_exactly(self, store: TraceStore) -> None:
        call = make_call(1)
        assert store.add_call("s", call) == 0
        (back,) = store.calls("s")
        assert back == call
        assert back.logprobs == call.logprobs and [repr(x) for x in back.logprobs] == [repr(x) for x in call.logprobs]
        assert back.sampling == call.sampling and back.tools == call.tools and back.messages == call.messages

    def test_seq_follows_arrival_and_add_call_is_idempotent(self, store: TraceStore) -> None:
        for i in range(5):
            assert store.add_call("s", make_call(i)) == i
        assert store.add_call("s", make_call(2)) == 2  # a retried insert
        assert [c.call_id for c in store.calls("s")] == [f"call-{i:05d}" for i in range(5)]
        record = store.get_session("s")
        assert record is not None and record.num_calls == 5
        with pytest.raises(StoreError, match="already stored in session 's'"):
            store.add_call("other", make_call(2))
        assert store.calls("unknown") == []

    def test_create_session_is_idempotent(self, store: TraceStore) -> None:
        assert store.create_session("s", metadata={"user": "a"}) == "s"
        assert store.create_session("s", task_key="k", metadata={"user": "b"}) == "s"
        record = store.get_session("s")
        assert record is not None
        assert record.metadata == {"user": "a"} and record.task_key == "k"  # only a missing key is filled
        assert len(store.create_session()) > 0
        assert store.get_session("missing") is None
        with pytest.raises(StoreError, match="session id"):
            store.create_session("x" * 200)

    def test_end_and_flag_keep_the_first_value(self, store: TraceStore) -> None:
        store.create_session("s")
        store.end_session("s")
        store.flag_session("s", "secret seen")
        first = store.get_session("s")
        store.end_session("s")
        store.flag_session("s", "another reason")
        again = store.get_session("s")
        assert first is not None and again is not None
        assert again.ended_at == first.ended_at and again.flagged_reason == "secret seen"
        for op in (lambda: store.end_session("nope"), lambda: store.flag_session("nope", "r"),
                   lambda: store.add_skill("nope", Skill(success=True, skill="s", valid=True))):
            with pytest.raises(StoreError, match="unknown session 'nope'"):
                op()

    # ---------------------------------------------------------------- rewards

    def test_rewards_and_precedence(self, store: TraceStore) -> None:
        store.create_session("s")
        assert store.session_reward("s") is None
        store.add_reward("s", 0.2, source="judge")
        store.add_reward("s", 0.0, source="user", turn=1, comment="wrong tool")
        store.add_reward("s", 1.0, source="user")
        assert store.session_reward("s") == 0.0  # user outranks judge; first of its values
        assert store.session_reward("s", RewardPolicy(combine="mean")) == 0.5
        assert store.session_reward("s", RewardPolicy(combine="last")) == 1.0
        assert store.session_reward("s", RewardPolicy(precedence=["judge"])) == 0.2
        store.add_reward("s", 1.0, source="verifier")
        assert store.session_reward("s") == 1.0
        rewards = store.rewards("s")
        assert [(r.source, r.value, r.turn, r.comment) for r in rewards] == [
            ("judge", 0.2, None, None), ("user", 0.0, 1, "wrong tool"), ("user", 1.0, None, None),
            ("verifier", 1.0, None, None)]
        assert rewards[0].reward_id < rewards[-1].reward_id
        with pytest.raises(StoreError, match="unknown session"):
            store.add_reward("nope", 1.0, source="user")
        for bad in (float("nan"), float("inf")):
            with pytest.raises(StoreError, match="finite"):
                store.add_reward("s", bad, source="user")

    def test_unlisted_sources_rank_after_listed_in_arrival_order(self, store: TraceStore) -> None:
        store.create_session("s")
        store.add_reward("s", 0.3, source="env")
        store.add_reward("s", 0.7, source="heuristic")
        assert store.session_reward("s") == 0.3
        store.add_reward("s", 0.9, source="judge")
        assert store.session_reward("s") == 0.9
        assert store.session_reward("s", RewardPolicy(precedence=["verifier"], ignore_unlisted=True)) is None

    # ------------------------------------------------------- selecting sessions

    def test_trainable_sessions_filters(self, store: TraceStore) -> None:
        finished_session(store, "ok")
        finished_session(store, "open", end=False)
        finished_session(store, "unrewarded", reward=None)
        finished_session(store, "no-calls", calls=0)
        finished_session(store, "flagged")
        store.flag_session("flagged", "secret seen")
        finished_session(store, "consumed")
        assert store.claim_sessions(["consumed"], "u0") == ["consumed"]
        finished_session(store, "other-task", task_key="task-b")
        assert [s.session_id for s in store.trainable_sessions()] == ["ok", "other-task"]
        assert [s.session_id for s in store.trainable_sessions(limit=1)] == ["ok"]
        only_verifier = RewardPolicy(precedence=["verifier"], ignore_unlisted=True)
        assert store.trainable_sessions(only_verifier) == []
        ids = lambda **kw: {s.session_id for s in store.sessions(**kw)}  # noqa: E731
        assert ids(ended=False) == {"open"}
        assert ids(rewarded=False) == {"unrewarded"}
        assert ids(flagged=True) == {"flagged"}
        assert ids(consumed=True) == {"consumed"}
        assert ids(task_key="task-b") == {"other-task"}
        assert len(store.sessions()) == 7 and len(store.sessions(limit=3)) == 3
        consumed = store.get_session("consumed")
        assert consumed is not None and consumed.consumed_by == "u0"

    def test_claim_is_exactly_once_under_racing_threads(self, store: TraceStore) -> None:
        ids = [finished_session(store, f"s{i:02d}") for i in range(50)]
        store.flag_session("s07", "secret seen")
        claimed: dict[str, list[str]] = {}

        def claimer(i: int, barrier: threading.Barrier) -> None:
            mine = ids[:]
            random.Random(i).shuffle(mine)
            barrier.wait()
            got = []
            for k in range(0, len(mine), 5):
                got += store.claim_sessions(mine[k:k + 5], f"update-{i}")
            claimed[f"update-{i}"] = got

        run_threads(8, claimer)
        everything = [sid for got in claimed.values() for sid in got]
        assert sorted(everything) == sorted(set(ids) - {"s07"})  # each once; flagged never
        for update_id, got in claimed.items():
            assert all(store.get_session(sid).consumed_by == update_id for sid in got)  # type: ignore[union-attr]
        assert store.claim_sessions(ids, "late") == []

    # ------------------------------------------------------- continual-loop cycles

    def test_cycles_claim_each_session_exactly_once_under_racing_loops(self, store: TraceStore) -> None:
        """8 loops (one model name each: a name has one open cycle) claim 4 at a time until
        nothing is left: every trainable session in exactly one cycle, flagged ones never,
        and sessions another trainer consumed are skipped."""
        ids = [finished_session(store, f"s{i:02d}") for i in range(40)]
        store.flag_session("s07", "secret seen")
        assert store.claim_sessions(["s11"], "train-run") == ["s11"]
        claimed: dict[str, list[str]] = {}

        def loop(i: int, barrier: threading.Barrier) -> None:
            name, got = f"model-{i}", []
            barrier.wait()
            while (started := store.start_cycle(name, base_version=0, limit=4)) is not None:
                cycle, sids = started
                assert 1 <= len(sids) <= 4 and store.cycle_sessions(cycle.cycle_id) == sids
                got += sids
                store.finish_training(cycle.cycle_id, path=f"/adapters/{cycle.cycle_id}")
                store.advance_cycle(cycle.cycle_id, ("trained",), "decided")  # the loop loads and decides here
            claimed[name] = got

        run_threads(8, loop)
        everything = [sid for got in claimed.values() for sid in got]
        assert sorted(everything) == sorted(set(ids) - {"s07", "s11"})
        states = store.claim_states()
        assert set(states) == set(everything) and {s for _, s, _ in states.values()} == {"trained"}
        for sid in everything:
            cycle_id, _, _ = states[sid]
            assert store.get_session(sid).consumed_by == f"cycle-{cycle_id}"  # type: ignore[union-attr]
        assert store.queue_lengths().model_dump() == {"unclaimed": 0, "claimed": 0, "trained": 38, "unusable": 0}

    def test_a_cycle_moves_through_its_states_once(self, store: TraceStore) -> None:
        for i in range(5):
            finished_session(store, f"s{i}")
        finished_session(store, "unrewarded", reward=None)
        VersionRegistry(store).bootstrap("m", served_name="base")
        cycle, sids = store.start_cycle("m", base_version=0, limit=3)  # type: ignore[misc]
        assert (cycle.state, cycle.attempts, sids) == ("claimed", 1, ["s0", "s1", "s2"])
        assert store.queue_lengths().model_dump() == {"unclaimed": 2, "claimed": 3, "trained": 0, "unusable": 0}
        with pytest.raises(StoreError, match="unfinished cycle"):
            store.start_cycle("m", base_version=0, limit=3)
        assert store.open_cycle("m") == cycle and store.open_cycle("other") is None
        assert store.resume_cycle(cycle.cycle_id, base_version=0).attempts == 2
        with pytest.raises(StoreError, match="'claimed'; it can move to 'decided' only from 'loaded'"):
            store.advance_cycle(cycle.cycle_id, ("loaded",), "decided")

        trained, version = store.finish_training(cycle.cycle_id, path="/a/1", unusable={"s1": "unreplayable"})
        assert (trained.state, trained.candidate_version) == ("trained", version.version) and version.version == 1
        assert (version.status, version.metadata["served_name"], version.metadata["cycle"]) == ("candidate", "m-v1", cycle.cycle_id)
        assert VersionRegistry(store).pending("m") == [version]
        with pytest.raises(StoreError, match="is 'trained'"):  # a second training of the same cycle
            store.finish_training(cycle.cycle_id, path="/a/2")
        assert len(store.model_versions("m")) == 2  # base + one candidate, not two
        assert store.cycle_sessions(cycle.cycle_id, "trained") == ["s0", "s2"]
        assert store.claim_states(["s1"]) == {"s1": (cycle.cycle_id, "unusable", "unreplayable")}
        loaded = store.advance_cycle(cycle.cycle_id, ("trained",), "loaded", metadata={"served_as": "m-v1"})
        assert loaded.metadata == {"served_as": "m-v1"}
        decision = VersionRegistry(store).record_decision("m", 1, promote_verdict(), baseline=0)
        done = store.advance_cycle(cycle.cycle_id, ("loaded",), "decided", decision_id=decision.decision_id)
        assert done.state == "decided" and store.open_cycle("m") is None
        assert store.queue_lengths().model_dump() == {"unclaimed": 2, "claimed": 0, "trained": 2, "unusable": 1}

        nxt, rest = store.start_cycle("m", base_version=1, limit=10)  # type: ignore[misc]
        assert rest == ["s3", "s4"] and nxt.cycle_id != cycle.cycle_id
        assert store.finish_training(nxt.cycle_id, path="/a/2")[1].version == 2
        assert [c.state for c in store.cycles("m")] == ["decided", "trained"]
        assert store.start_cycle("x", base_version=None, limit=5) is None  # nothing waits: nothing written
        assert [c.name for c in store.cycles()] == ["m", "m"]

    def test_release_gives_sessions_back_and_skip_retires_them(self, store: TraceStore) -> None:
        for i in range(4):
            finished_session(store, f"s{i}")
        first, sids = store.start_cycle("m", base_version=None, limit=2)  # type: ignore[misc]
        released = store.release_cycle(first.cycle_id, "the server died")
        assert released.state == "released" and released.metadata["released"] == {"reason": "the server died", "sessions": 2}
        assert store.claim_states() == {} and all(store.get_session(s).consumed_by is None for s in sids)  # type: ignore[union-attr]
        again, sids2 = store.start_cycle("m", base_version=None, limit=2)  # type: ignore[misc]
        assert sids2 == sids  # the same sessions, now in a new cycle
        with pytest.raises(StoreError, match="have no reason to be unusable"):
            store.skip_cycle(again.cycle_id, {"s0": "unreplayable"})
        skipped = store.skip_cycle(again.cycle_id, {"s0": "unreplayable", "s1": "unreplayable"})
        assert skipped.state == "skipped" and store.model_versions("m") == []
        _, sids3 = store.start_cycle("m", base_version=None, limit=5)  # type: ignore[misc]
        assert sids3 == ["s2", "s3"]  # unusable sessions are never claimed again
        assert store.queue_lengths().model_dump() == {"unclaimed": 0, "claimed": 2, "trained": 0, "unusable": 2}

    def test_concurrent_writers_lose_and_duplicate_nothing(self, store: TraceStore) -> None:
        def writer(i: int, barrier: threading.Barrier) -> None:
            barrier.wait()
            for j in range(15):
                call = small_call(f"w{i}-{j}")
                store.add_call(f"shared-{j % 3}", call, task_key="k")
                store.add_call(f"shared-{j % 3}", call)  # a client retry
                store.add_call(f"own-{i}", small_call(f"o{i}-{j}"))
                if j % 5 == 0:
                    store.add_reward(f"own-{i}", 1.0, source="user")

        run_threads(6, writer)
        total = 0
        for sid in [f"shared-{k}" for k in range(3)] + [f"own-{i}" for i in range(6)]:
            got = store.calls(sid)
            total += len(got)
            assert len({c.call_id for c in got}) == len(got)
        assert total == 6 * 15 * 2
        assert sum(len(store.rewards(f"own-{i}")) for i in range(6)) == 6 * 3
        assert {len(store.calls(f"shared-{k}")) for k in range(3)} == {30}

    # ------------------------------------------------------------ trajectories

    def test_to_trajectory(self, store: TraceStore) -> None:
        store.create_session("s", task_key="task-a", metadata={"user": "u1"})
        calls = [make_call(i) for i in range(3)]
        for c in calls:
            store.add_call("s", c)
        skill = Skill(trajectory_id="s", task_id="task-a", success=True, skill="check the map first", valid=True)
        store.add_skill("s", skill)
        store.add_reward("s", 1.0, source="verifier")
        store.end_session("s")
        traj = store.to_trajectory("s")
        assert (traj.trajectory_id, traj.task_id, traj.group_id) == ("s", "task-a", "store-task-a")
        assert traj.calls == calls and traj.reward == 1.0 and traj.success and traj.skill == skill
        assert traj.metadata["session_id"] == "s" and traj.metadata["user"] == "u1" and traj.metadata["rewarded"]
        store.create_session("bare")
        bare = store.to_trajectory("bare")
        assert (bare.task_id, bare.group_id, bare.reward, bare.success) == ("bare", "store-bare", 0.0, False)
        assert not bare.metadata["rewarded"]
        with pytest.raises(StoreError, match="unknown session"):
            store.to_trajectory("nope")

    def test_store_sink_records_a_capture_scope(self, store: TraceStore) -> None:
        sink = StoreSink(store)
        a, b = small_call("a"), small_call("b")
        with capture(sink=sink, trajectory_id="ep1", task_id="task-a", run="r"):
            record_call(a)
            with capture(purpose="analyzer", step=2):
                record_call(b)
        with capture(sink=sink):
            record_call(small_call("unlabelled"))
        stored = store.calls("ep1")
        assert [c.call_id for c in stored] == ["a", "b"] and stored == [a, b]
        assert stored[1].scope == {"trajectory_id": "ep1", "task_id": "task-a", "run": "r", "step": 2}
        assert store.get_session("ep1").task_key == "task-a"  # type: ignore[union-attr]
        assert [c.call_id for c in store.calls(sink.default_session_id)] == ["unlabelled"]

        skill = Skill(trajectory_id="ep1", task_id="task-a", success=True, skill="open the door first", valid=True)
        traj = Trajectory(trajectory_id="ep1", task_id="task-a", group_id="g-task-a", calls=[a, b], reward=1.0,
                          success=True, skill=skill)
        sink.write("trajectory", traj)
        sink.write("trajectory", traj)  # a re-sent episode adds nothing
        sink.write("something-else", traj)
        assert store.calls("ep1") == [a, b]
        assert [(r.source, r.value) for r in store.rewards("ep1")] == [("env", 1.0)]
        back = store.to_trajectory("ep1")
        assert back.skill == skill and back.reward == 1.0 and back.metadata["episode"]["group_id"] == "g-task-a"
        assert [s.session_id for s in store.trainable_sessions(RewardPolicy(precedence=["env"]))] == ["ep1"]

        faulted = Trajectory(task_id="task-a", group_id="g", reward=0.0, stop_reason=StopReason.ERROR,
                             fault=FaultKind.BACKEND, error="server down")
        sink.write("trajectory", faulted)
        assert store.get_session(faulted.trajectory_id).flagged_reason == "fault: backend"  # type: ignore[union-attr]
        back = store.to_trajectory(faulted.trajectory_id)
        assert (back.fault, back.stop_reason, back.error, back.trainable) == (
            FaultKind.BACKEND, StopReason.ERROR, "server down", False)
        sink.close()
        with pytest.raises(ValueError, match="closed"):
            sink.write("call", small_call("late"))

    def test_export_round_trips_through_read_jsonl(self, store: TraceStore, tmp_path: Path) -> None:
        finished_session(store, "ok")
        finished_session(store, "open", end=False)
        store.add_skill("ok", Skill(success=True, skill="always look first", valid=True))
        out = tmp_path / "export" / "trajectories.jsonl"
        assert export_trajectories(store, out) == 2
        back = read_jsonl(out, Trajectory)
        assert back == [store.to_trajectory("ok"), store.to_trajectory("open")]
        assert export_trajectories(store, out, only_trainable=True) == 1
        assert [t.trajectory_id for t in read_jsonl(out, Trajectory)] == ["ok"]
        assert not list(tmp_path.glob("export/*.partial"))

    # ---------------------------------------------------------- model versions

    def test_model_versions(self, store: TraceStore) -> None:
        v1 = store.add_model_version("policy", "/ckpt/1", metadata={"update": "u1"})
        v2 = store.add_model_version("policy", "/ckpt/2")
        assert (v1.version, v2.version, v2.status) == (1, 2, "candidate")
        with pytest.raises(StoreError, match="already exists"):
            store.add_model_version("policy", "/ckpt/x", version=2)
        promoted = store.set_version_status("policy", 1, "promoted", metadata={"canary": 0.8})
        assert promoted.status == "promoted" and promoted.metadata == {"update": "u1", "canary": 0.8}
        assert promoted.updated_at >= promoted.created_at
        assert [v.version for v in store.model_versions("policy", status="promoted")] == [1]
        assert [v.version for v in store.model_versions()] == [1, 2]
        with pytest.raises(StoreError, match="unknown model version"):
            store.set_version_status("policy", 9, "rejected")

    # ------------------------------------------------- promotions and decisions

    def test_switch_promoted_moves_the_pointer_with_its_decision(self, store: TraceStore) -> None:
        for v in (1, 2, 3):
            store.add_model_version("policy", f"/ckpt/{v}", metadata={"served_name": f"p-v{v}"})
        evidence = {"gate": {"ci_low": -1 / 3, "per_task": {"t": 0.1}}, "nested": [1, None, "x"]}
        first = store.switch_promoted("policy", 1, action="promote", actor="gate", summary="first",
                                      evidence=evidence, allow_from=("candidate",), expect_current=None)
        assert (first.from_version, first.to_version, first.evidence) == (None, 1, evidence)
        second = store.switch_promoted("policy", 2, action="promote", actor="gate", summary="second",
                                       evidence={}, allow_from=("candidate",), expect_current=1)
        assert (second.from_version, second.to_version) == (1, 2)
        assert {v.version: v.status for v in store.model_versions("policy")} == {1: "retired", 2: "promoted", 3: "candidate"}
        promoted = store.promoted_version("policy")
        assert promoted is not None and promoted.version == 2 and promoted.metadata["served_name"] == "p-v2"
        assert promoted.metadata["last_decision"]["decision_id"] == second.decision_id
        with pytest.raises(StoreError, match="is v2, not v1"):  # compare-and-swap against a stale baseline
            store.switch_promoted("policy", 3, action="promote", actor="gate", summary="stale", evidence={},
                                  allow_from=("candidate",), expect_current=1)
        with pytest.raises(StoreError, match="cannot promote policy v1: it is retired"):
            store.switch_promoted("policy", 1, action="promote", actor="gate", summary="x", evidence={},
                                  allow_from=("candidate",))
        rejected = store.decide_version("policy", 3, "rejected", action="reject", actor="gate", summary="worse",
                                        evidence={"ci_low": -0.5}, allow_from=("candidate",))
        assert (rejected.from_version, rejected.to_version, rejected.version) == (2, 2, 3)
        with pytest.raises(StoreError, match="unknown model version policy v9"):
            store.decide_version("policy", 9, "rejected", action="reject", actor="gate", summary="", evidence={},
                                 allow_from=("candidate",))
        assert [d.summary for d in store.decisions("policy")] == ["first", "second", "worse"]
        assert [d.summary for d in store.decisions("policy", limit=2)] == ["second", "worse"]
        assert store.decisions("other") == [] and store.promoted_version("other") is None

    def test_canary_episodes_are_stored_with_their_decision_or_not_at_all(self, store: TraceStore) -> None:
        registry = VersionRegistry(store)
        registry.bootstrap("policy", "base")
        for _ in range(3):
            registry.add_candidate("policy", "/a")
        trace = EpisodeTrace(tool_calls=[ToolCallTrace(name="borrow", args='{"id": 1}', result="ok ✓"),
                                         ToolCallTrace(name="pay", args="{}", error="Error: HTTP 409")],
                             answer="dönë", turns=3, invalid_tool_calls=1)
        canary = [CanaryEpisode(side=side, version=v, task_id=f"t{i}", seed=k, reward=r, success=r >= 1,
                                fault=FaultKind.TIMEOUT if (i, k, side) == (1, 1, "candidate") else None, trace=trace)
                  for side, v, r in (("promoted", 0, 1.0), ("candidate", 1, 1 / 3)) for i in range(2) for k in range(2)]
        promoted = registry.record_decision("policy", 1, promote_verdict(), baseline=0, canary=canary)
        stored = store.canary_episodes([promoted.decision_id])
        assert [e.model_dump(exclude={"episode_id", "decision_id", "name", "created_at"}) for e in stored] == \
            [e.model_dump(mode="json") for e in canary]  # every field round-trips, in order
        assert {(e.decision_id, e.name) for e in stored} == {(promoted.decision_id, "policy")}
        assert registry.canary_episodes(promoted.decision_id) == stored

        with pytest.raises(StoreError, match="is v1, not v0"):  # refused decision: its episodes are not kept either
            registry.promote("policy", 2, promote_verdict(), baseline=0, canary=canary[:1])
        with pytest.raises(StoreError, match="a canary episode needs"):
            store.decide_version("policy", 2, "rejected", action="reject", actor="gate", summary="x", evidence={},
                                 allow_from=("candidate",), canary=[{"side": "nobody"}])
        assert len(store.decisions("policy")) == 2 and len(store.canary_episodes(name="policy")) == len(canary)
        drill = registry.record_drill("policy", 2, promote_verdict(), baseline=1, canary=canary[4:], how={"strength": 1})
        assert (drill.action, drill.from_version, drill.to_version, drill.evidence["would_promote"]) == ("drill", 1, 1, True)
        assert store.promoted_version("policy").version == 1  # type: ignore[union-attr] - a drill never promotes
        assert [e.version for e in store.canary_episodes([drill.decision_id])] == [1] * 4
        plain = registry.discard("policy", 3, reason="no canary")
        assert store.canary_episodes([plain.decision_id]) == []
        assert [e.decision_id for e in store.canary_episodes()] == [promoted.decision_id] * 8 + [drill.decision_id] * 4

    def test_the_database_refuses_a_second_promoted_version(self, store: TraceStore) -> None:
        store.add_model_version("policy", "/1", status="promoted")
        store.add_model_version("policy", "/2")
        with pytest.raises(StoreError, match="already has a promoted version"):
            store.set_version_status("policy", 2, "promoted")
        with pytest.raises(StoreError, match="already has a promoted version"):
            store.add_model_version("policy", "/3", status="promoted")
        store.add_model_version("other", "/1", status="promoted")  # one per name
        assert [(v.name, v.version) for v in store.model_versions(status="promoted")] == [("other", 1), ("policy", 1)]

    def test_racing_gate_promotions_against_one_baseline_let_exactly_one_through(self, store: TraceStore,
                                                                                 store_url: str) -> None:
        """Six loops (each with its own engine, as separate processes have) promote six
        candidates compared against v0 at the same instant: one wins, five are refused."""
        registry = VersionRegistry(store)
        registry.bootstrap("policy", "base")
        for v in range(1, 7):
            registry.add_candidate("policy", f"/ckpt/{v}")
        verdict, wins, refused = promote_verdict(), [], []

        def promote(i: int, barrier: threading.Barrier) -> None:
            with TraceStore.open(store_url) as own:
                barrier.wait()
                try:
                    wins.append(VersionRegistry(own).promote("policy", i + 1, verdict, baseline=0).version)
                except StoreError as e:
                    refused.append(str(e))

        run_threads(6, promote)
        assert len(wins) == 1 and len(refused) == 5 and all("not v0" in r for r in refused)
        statuses = {v.version: v.status for v in registry.versions("policy")}
        assert [v for v, s in statuses.items() if s == "promoted"] == wins
        assert sorted(v for v, s in statuses.items() if s == "candidate") == sorted(set(range(1, 7)) - set(wins))
        assert [d.actor for d in registry.decisions("policy")] == ["bootstrap", "gate"]

    def test_promoting_processes_never_leave_two_promoted(self, store: TraceStore, store_url: str,
                                                          tmp_path: Path) -> None:
        registry = VersionRegistry(store)
        for v in range(1, 5):
            registry.add_candidate("policy", f"/ckpt/{v}")
        script = tmp_path / "promoter.py"
        script.write_text(PROMOTER)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        procs = [subprocess.Popen([sys.executable, str(script), store_url, versions], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env) for versions in ("1,2", "3,4")]
        try:
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            assert [proc.wait(120) for proc in procs] == [0, 0]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        history = registry.decisions("policy")
        assert len(history) == 40
        assert [d.from_version for d in history[1:]] == [d.to_version for d in history[:-1]]  # one chain
        assert len(store.model_versions("policy", status="promoted")) == 1
        assert store.promoted_version("policy").version == history[-1].to_version  # type: ignore[union-attr]

    def test_kill_9_inside_a_promotion_leaves_the_old_version_serving(self, store: TraceStore, store_url: str,
                                                                      tmp_path: Path) -> None:
        registry = VersionRegistry(store)
        registry.add_candidate("policy", "/ckpt/1")
        registry.add_candidate("policy", "/ckpt/2")
        registry.promote_manually("policy", 1)
        script = tmp_path / "killed.py"
        script.write_text(KILLED_PROMOTER)
        proc = subprocess.run([sys.executable, str(script), store_url], check=False,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                              timeout=120)
        assert proc.returncode == -signal.SIGKILL
        served = registry.resolve("policy")
        assert served is not None and served.version == 1
        assert {v.version: v.status for v in registry.versions("policy")} == {1: "promoted", 2: "candidate"}
        assert len(registry.decisions("policy")) == 1
        assert registry.promote_manually("policy", 2).to_version == 2  # the store carries on

    def test_migration_2_keeps_one_promoted_version_per_name(self, store_url: str) -> None:
        """A version-1 database could hold several promoted versions of a name: the most
        recently updated stays promoted, the others are retired with a decision each."""
        from seed_agents.store.schema import model_versions

        engine = create_engine(parse_url(store_url))
        try:
            assert schema.migrate(engine, schema.MIGRATIONS[:1]) == 1
            with engine.begin() as conn:
                for name, v, status, updated in (("policy", 1, "promoted", 10.0), ("policy", 2, "promoted", 30.0),
                                                 ("policy", 3, "candidate", 40.0), ("policy", 4, "promoted", 20.0),
                                                 ("solo", 1, "promoted", 5.0)):
                    conn.execute(sa.insert(model_versions).values(name=name, version=v, path="/p", status=status,
                                                                  created_at=1.0, updated_at=updated, metadata={}))
            assert schema.migrate(engine) == len(schema.MIGRATIONS)
        finally:
            engine.dispose()
        with TraceStore.open(store_url) as store:
            assert {v.version: v.status for v in store.model_versions("policy")} == \
                {1: "retired", 2: "promoted", 3: "candidate", 4: "retired"}
            assert store.promoted_version("solo").version == 1  # type: ignore[union-attr]
            retired = store.decisions("policy")
            assert [(d.version, d.action, d.actor, d.to_version) for d in retired] == \
                [(4, "retire", "migration", 2), (1, "retire", "migration", 2)]
            with pytest.raises(StoreError, match="already has a promoted version"):
                store.set_version_status("policy", 3, "promoted")

    # ---------------------------------------------------------------- migrations

    def test_older_database_is_migrated_and_keeps_its_data(self, store: TraceStore, store_url: str) -> None:
        store.add_call("s", make_call(0))
        engine = create_engine(parse_url(store_url))
        try:
            def v2_add_column(conn: Connection) -> None:
                conn.execute(sa.text("ALTER TABLE sessions ADD COLUMN note TEXT"))
                conn.execute(sa.text("UPDATE sessions SET note = 'migrated'"))

            def broken(conn: Connection) -> None:
                conn.execute(sa.text("ALTER TABLE sessions ADD COLUMN half TEXT"))
                raise RuntimeError("migration bug")

            current = len(schema.MIGRATIONS)
            with pytest.raises(RuntimeError, match="migration bug"):
                schema.migrate(engine, [*schema.MIGRATIONS, v2_add_column, broken])
            with engine.connect() as conn:  # one transaction: nothing of it stayed
                assert schema.stored_version(conn) == current
                assert "note" not in {c["name"] for c in sa.inspect(conn).get_columns("sessions")}
            assert schema.migrate(engine, [*schema.MIGRATIONS, v2_add_column]) == current + 1
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT note FROM sessions")).scalar() == "migrated"
        finally:
            engine.dispose()
        assert store.calls("s") == [make_call(0)]
        with pytest.raises(StoreError, match=f"version {current + 1}, newer than this code"):
            TraceStore.open(store_url)

    def test_migration_5_adds_canary_episodes_to_a_version_4_store(self, store_url: str) -> None:
        engine = create_engine(parse_url(store_url))
        try:
            assert schema.migrate(engine, schema.MIGRATIONS[:4]) == 4
            with engine.connect() as conn:
                assert not sa.inspect(conn).has_table("canary_episodes")
        finally:
            engine.dispose()
        with TraceStore.open(store_url) as store:  # opening migrates
            registry = VersionRegistry(store)
            registry.bootstrap("policy", "base")
            registry.add_candidate("policy", "/a")
            d = registry.record_decision("policy", 1, promote_verdict(), baseline=0, canary=[
                CanaryEpisode(side="candidate", version=1, task_id="t", seed=0, reward=1.0, success=True)])
            assert [e.task_id for e in store.canary_episodes([d.decision_id])] == ["t"]

    def test_every_gateway_reports_itself_in_one_row(self, store: TraceStore) -> None:
        store.beat_gateway("gw-a", url="http://10.0.0.1:8080", started_at=1.0, state={"policy_version": 0})
        store.beat_gateway("gw-b", url="http://10.0.0.2:8080", started_at=2.0, state={"policy_version": 0})
        store.beat_gateway("gw-a", url="http://10.0.0.1:8080", started_at=1.0, state={"policy_version": 1})
        rows = {g.name: g for g in store.gateways()}
        assert set(rows) == {"gw-a", "gw-b"} and rows["gw-a"].state == {"policy_version": 1}
        assert store.gateways()[0].name == "gw-a"  # most recently seen first

    def test_fresh_database_gets_the_current_version(self, store: TraceStore, store_url: str) -> None:
        engine = create_engine(parse_url(store_url))
        try:
            with engine.connect() as conn:
                assert schema.stored_version(conn) == len(schema.MIGRATIONS)
            assert schema.migrate(engine) == len(schema.MIGRATIONS)  # reopening changes nothing
        finally:
            engine.dispose()

    # ------------------------------------------------------------- crash safety

    def test_kill_9_loses_no_finished_call(self, store_url: str, tmp_path: Path) -> None:
        """A writer killed mid-stream leaves only whole calls, and a rerun duplicates none."""
        script = tmp_path / "writer.py"
        script.write_text(WRITER)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.Popen([sys.executable, str(script), store_url, "-1"], stdout=subprocess.PIPE, text=True,
                                env=env)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            time.sleep(random.uniform(0.2, 0.4))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        assert proc.returncode == -signal.SIGKILL
        sys.path.insert(0, str(tmp_path))
        try:
            import writer  # the script's own call(i): what each stored row must equal
        finally:
            sys.path.remove(str(tmp_path))
            sys.modules.pop("writer", None)
        with TraceStore.open(store_url) as store:
            stored = {sid: store.calls(sid) for sid in ("s0", "s1", "s2")}  # every row validates as LLMCall
            n = sum(len(v) for v in stored.values())
            assert n > 10
            for sid, got in stored.items():
                indices = [int(c.call_id[1:]) for c in got]
                assert indices == list(range(int(sid[1]), n, 3))  # a prefix of the stream: no gap, no duplicate
                for i, c in zip(indices, got, strict=True):
                    assert c.model_dump(exclude={"started_at"}) == writer.call(i).model_dump(exclude={"started_at"})
            rerun = subprocess.run([sys.executable, str(script), store_url, str(n)], env=env, timeout=60)
            assert rerun.returncode == 0
            assert sum(len(store.calls(sid)) for sid in stored) == n
