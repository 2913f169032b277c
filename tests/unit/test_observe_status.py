"""What the watch views read from the store, and ``seed-agents status`` / ``report`` on it.

A real SQLite store filled by ``seed_agents.observe.testing.populate`` (the store's public
writes: versions decided by the real gate, sessions with tool calls, rewards, skills).
"""

from __future__ import annotations

import re

import pytest

from seed_agents.app.cli import _parser
from seed_agents.errors import ConfigError
from seed_agents.observe.data import (
    QUEUES,
    decision_counts,
    evidence_summary,
    outcomes,
    queue_lengths,
    read_overview,
    reward_counts,
    session_points,
)
from seed_agents.observe.status import render_status
from seed_agents.observe.testing import MODEL, Populated, populate
from seed_agents.store import RewardPolicy, TraceStore
from seed_agents.types import LLMCall


@pytest.fixture
def filled(store: TraceStore) -> Populated:
    return populate(store, hours=4, per_hour=3)


def _call(version: int, purpose: str = "policy") -> LLMCall:
    return LLMCall(messages=[{"role": "user", "content": "hi"}], prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1],
                   policy_version=version, purpose=purpose)


def test_points_take_the_first_policy_calls_version_and_the_policys_reward(store):
    store.add_call("a", _call(7, "analyzer"))  # an analyzer call does not say who served
    store.add_call("a", _call(3))
    store.add_call("a", _call(4))  # switched mid-session: counts for the version it started on
    store.add_reward("a", 0.0, source="user")
    store.add_reward("a", 1.0, source="verifier")  # the verifier outranks the user
    store.create_session("b")
    store.add_call("c", _call(4))
    store.flag_session("c", "fault: env")
    store.add_reward("c", 1.0, source="verifier")
    a, b, c = session_points(store)
    assert (a.session_id, a.version, a.reward, a.num_calls, a.faulted) == ("a", 3, 1.0, 3, False)
    assert (b.version, b.reward, b.num_calls) == (None, None, 0)
    assert c.faulted and c.reward == 1.0
    assert [(o.version, o.reward) for o in outcomes([a, b, c])] == [(3, 1.0)]  # b unrewarded, c faulted
    only_users = RewardPolicy(precedence=["user"], ignore_unlisted=True)
    assert session_points(store, only_users)[0].reward == 0.0


def test_queue_lengths_count_each_queue(store, filled):
    q = queue_lengths(store)
    assert set(q) == set(QUEUES)
    assert q["open"] == 1 and q["awaiting_reward"] == 1 and q["flagged"] == 2
    assert q["trained"] == len(store.sessions(consumed=True)) == 3  # every other session of the first 2 hours
    assert q["candidates_undecided"] == 1
    # the same sessions TraceStore would hand a trainer
    assert q["ready_to_train"] == len(store.trainable_sessions()) == 4 * 3 + 1 - 3


def test_counts_by_source_and_decision(store, filled):
    assert reward_counts(store) == {"user": 4 + 1, "verifier": 4 * 3 + 2}
    assert decision_counts(store) == {(MODEL, "promote", "bootstrap"): 1, (MODEL, "promote", "gate"): 1,
                                      (MODEL, "reject", "gate"): 1}


def test_evidence_summary_reads_the_gates_statistics(store, filled):
    bootstrap, promote, reject = store.decisions(MODEL)
    assert evidence_summary(promote).startswith("promote, diff +0.500, low +")
    assert "8 tasks/8 pairs" in evidence_summary(promote) and "baseline v0" in evidence_summary(promote)
    assert evidence_summary(reject).startswith("reject, diff -0.250")
    assert evidence_summary(bootstrap) == "served_name: smollm2-135m"


def test_status_says_how_alike_a_candidate_played(store, filled):
    """Issue 66: a decision says how much of the canary played identically and how many of the
    update's groups had no reward variance, and calls a candidate identical on every pair
    indistinguishable, in its summary line and on the status screen."""
    from seed_agents.continual import GateConfig, VersionRegistry, decide
    from seed_agents.continual.canary import split_sides
    from seed_agents.observe.data import sameness_summary
    from seed_agents.observe.testing import _canary_episode

    bootstrap, promote, reject = store.decisions(MODEL)
    assert sameness_summary(bootstrap) is None
    assert sameness_summary(promote) == "4/8 canary pairs identical, 1/4 update groups without reward variance"
    assert "4/8 canary pairs identical" in promote.summary
    # v3, a candidate that plays every canary episode as v1 does
    copy = [_canary_episode(side, v, i, 1.0) for side, v in (("promoted", 1), ("candidate", 3)) for i in range(8)]
    VersionRegistry(store).record_decision(MODEL, 3, decide(*split_sides(copy), GateConfig(resamples=200)),
                                           baseline=1, canary=copy)
    text = render_status(read_overview(store), store_label="s", width=200)
    decisions = text.split("DECISIONS")[1].split("SUCCESS OVER TIME")[0]
    assert "sameness: INDISTINGUISHABLE from the version it was compared with: 8/8 canary pairs identical" in decisions
    assert "; indistinguishable from the promoted version: 8/8 canary pairs identical" in decisions
    assert "sameness: 2/8 canary pairs identical, 3/4 update groups without reward variance" in decisions


def test_status_screen(store, filled):
    text = render_status(read_overview(store), store_label="sqlite:///x.db", width=200, window_s=3600)
    versions = text.split("VERSIONS")[1].split("DECISIONS")[0]
    assert re.search(r"policy\s+v1\s+PROMOTED\s+policy-v1\s.*\s(\d+)%", versions)
    assert re.search(r"policy\s+v2\s+rejected", versions) and re.search(r"policy\s+v3\s+candidate", versions)
    decisions = text.split("DECISIONS")[1].split("SUCCESS OVER TIME")[0]
    assert decisions.index("REJECT v2") < decisions.index("PROMOTE v1 by gate (v0 -> v1)")  # newest first
    assert "evidence: reject, diff -0.250" in decisions
    curve = text.split("SUCCESS OVER TIME")[1].split("QUEUES")[0]
    assert "window 1h" in curve and re.search(r"\n  v0 ", curve) and re.search(r"\n  v1 ", curve)
    # every rewarded, unfaulted v0 session of the store is in v0's row
    v0 = [o for o in outcomes(session_points(store)) if o.version == 0]
    row = re.search(r"\n  v0 (.*)", curve).group(1)
    assert sum(int(n) for n in re.findall(r"\(\d+/(\d+)\)", row)) == len(v0)
    assert re.search(r"ready_to_train\s+10\s", text)
    # 14 outcomes over 4 hours: the automatic window keeps about 5 sessions per window
    assert "window 6h" in render_status(read_overview(store), store_label="s")


def test_status_sees_every_gateway_on_the_store(store):
    replicas = [{"url": "http://a:8000", "in_rotation": True, "reason": ""},
                {"url": "http://b:8000", "in_rotation": False, "reason": "unreachable: cannot reach the model server"}]
    store.beat_gateway("gw-a", url="http://10.0.0.1:8080", started_at=1.0,
                       state={"upstream_model": "policy-v1", "policy_version": 1, "replicas": replicas, "spool_depth": 2,
                              "stopped": False, "counters": {"calls_stored": 17}})
    store.beat_gateway("gw-b", url="http://10.0.0.2:8080", started_at=1.0,
                       state={"upstream_model": "policy-v1", "policy_version": 1, "replicas": replicas[:1], "stopped": True})
    text = render_status(read_overview(store), store_label="s", width=200).split("GATEWAYS (2)")[1]
    assert re.search(r"gw-a\s+http://10.0.0.1:8080\s+\d+s ago\s+policy-v1 v1\s+1/2 in rotation\s+2\s+17", text)
    assert re.search(r"gw-b\s+\S+\s+stopped\s+policy-v1 v1\s+1/1 in rotation", text)
    assert "gw-a: http://b:8000 out of rotation: unreachable: cannot reach the model server" in text


def test_status_of_an_empty_store(store):
    text = render_status(read_overview(store), store_label="s")
    assert "none recorded yet" in text and "no rewarded sessions yet" in text and "DECISIONS (last 0)" in text


def _run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return args.func(args)


def test_cli_status_and_report(tmp_path, store, filled, capsys):
    url = f"sqlite:///{tmp_path}/traces.db"
    assert _run(["status", "--store", url, "--window", "30m", "--decisions", "1"]) == 0
    out = capsys.readouterr().out
    assert "window 30m" in out and "DECISIONS (last 1)" in out and "REJECT v2" in out
    page = tmp_path / "site" / "report.html"
    assert _run(["report", "--store", url, "--out", str(page), "--sessions", "3"]) == 0
    html = page.read_text()
    assert html.count('class="session"') == 3 and "wrote" in capsys.readouterr().out


def test_cli_refuses_a_missing_store_without_creating_it(tmp_path):
    with pytest.raises(ConfigError, match="no trace store at"):
        _run(["status", "--store", f"sqlite:///{tmp_path}/typo.db"])
    assert not (tmp_path / "typo.db").exists()
    with pytest.raises(ConfigError, match="store URL"):
        _run(["report", "--store", "nonsense://", "--out", str(tmp_path / "r.html")])
    with pytest.raises(ConfigError, match="window"):
        _run(["status", "--window", "soon"])


def test_queue_lengths_follow_a_continual_cycle(store, filled):
    """A cycle's claimed sessions are ``in_cycle`` until its update ends; then ``trained``,
    or ``unusable`` where the cycle could not replay them."""
    before = queue_lengths(store)
    cycle, claimed = store.start_cycle("cycle-test", base_version=None, limit=3)
    q = queue_lengths(store)
    assert len(claimed) == 3
    assert q["in_cycle"] == 3 and q["ready_to_train"] == before["ready_to_train"] - 3
    assert q["trained"] == before["trained"] and q["unusable"] == 0
    store.finish_training(cycle.cycle_id, path="runs/adapters/x", unusable={claimed[0]: "no recording"})
    q = queue_lengths(store)
    assert q["in_cycle"] == 0 and q["unusable"] == 1 and q["trained"] == before["trained"] + 2
