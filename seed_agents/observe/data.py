"""What the watch views (``status``, the HTML report, ``/metrics``) read from the trace store.

All three show the same numbers because they read them here. Aggregates (one point per
session, queue lengths, counts) are single SQL statements over the store's tables, so a
store with many sessions costs one query, not one read per session; the drill-down of a
few sessions, and of the canary episodes behind the latest decisions (``canary_views``),
goes through ``TraceStore``'s public reads.

Which version served a session: the ``policy_version`` stamped on its first policy call
(the gateway stamps the promoted version it sent the request to). A session that spans a
switch counts for the version it started on. Sessions flagged with a fault (an
infrastructure failure, ``flagged_reason`` "fault: ...") say nothing about the policy and
are left out of success; sessions flagged for a redacted secret are real traffic and count.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from seed_agents.observe.curve import Outcome
from seed_agents.store import (
    CanaryEpisodeRecord,
    DecisionRecord,
    GatewayRecord,
    ModelVersionRecord,
    RewardPolicy,
    RewardRecord,
    SessionRecord,
    TraceStore,
)
from seed_agents.store.schema import calls, canary_episodes, claims, decisions, model_versions, rewards, sessions
from seed_agents.tool_calls import parse_tool_calls
from seed_agents.types import LLMCall, Skill

T = TypeVar("T")

QUEUES: dict[str, str] = {
    "open": "sessions still receiving calls (not ended)",
    "awaiting_reward": "ended sessions with calls and no reward yet",
    "ready_to_train": "ended, rewarded, not trained on, not flagged: what the next update may take",
    "in_cycle": "sessions a continual cycle has claimed and not finished with (replays, update, canary)",
    "trained": "sessions an update has consumed (each at most once)",
    "unusable": "claimed sessions a cycle could not replay (no recorded task or recording)",
    "flagged": "sessions kept out of training (a secret seen, an infrastructure fault)",
    "candidates_undecided": "trained versions waiting for the gate's decision",
}
"""Queue name -> what it counts (status, report and /metrics share these names)."""

FAULT_PREFIX = "fault"
MAX_CANARY_DECISIONS = 10
"""The most decisions whose canary episodes one page drills into (newest first)."""


def _snapshot(store: TraceStore, fn: Callable[[Connection], T]) -> T:
    """Run ``fn`` in one read transaction of ``store`` (a consistent snapshot that never
    blocks writers).

    Why the private hook: these views aggregate over every session in SQL, and
    ``TraceStore`` has no public read-only query entry point; this is the one place that
    borrows ``TraceStore._read``. A public ``TraceStore.read(fn)`` would replace it.
    """
    return store._read(fn)


# -- one point per session ----------------------------------------------------------------


@dataclass(frozen=True)
class SessionPoint:
    """A session reduced to what the curves and queues need."""

    session_id: str
    task_key: str | None
    created_at: float
    ended: bool
    consumed: bool
    flagged_reason: str | None
    num_calls: int
    version: int | None  # policy_version of its first policy call; None without one
    reward: float | None  # the RewardPolicy's pick; None when unrewarded

    @property
    def faulted(self) -> bool:
        return (self.flagged_reason or "").startswith(FAULT_PREFIX)


def session_points(store: TraceStore, policy: RewardPolicy | None = None) -> list[SessionPoint]:
    """Every session in creation order, with its serving version and resolved reward."""
    policy = policy or RewardPolicy()
    first_version = (sa.select(calls.c.policy_version)
                     .where(calls.c.session_id == sessions.c.session_id, calls.c.purpose == "policy")
                     .order_by(calls.c.seq).limit(1).scalar_subquery())
    num_calls = sa.select(sa.func.count()).where(calls.c.session_id == sessions.c.session_id).scalar_subquery()
    session_query = (sa.select(sessions.c.session_id, sessions.c.task_key, sessions.c.created_at,
                               sessions.c.ended_at.is_not(None), sessions.c.consumed_by.is_not(None),
                               sessions.c.flagged_reason, num_calls, first_version)
                     .order_by(sessions.c.created_at, sessions.c.session_id))
    reward_query = sa.select(rewards).order_by(rewards.c.id)

    def tx(conn: Connection) -> tuple[list[Any], list[Any]]:
        return conn.execute(session_query).all(), list(conn.execute(reward_query).mappings())

    rows, reward_rows = _snapshot(store, tx)
    by_session: dict[str, list[RewardRecord]] = {}
    for r in reward_rows:
        by_session.setdefault(r["session_id"], []).append(RewardRecord(
            reward_id=r["id"], session_id=r["session_id"], value=r["value"], source=r["source"], turn=r["turn"],
            comment=r["comment"], created_at=r["created_at"]))
    return [SessionPoint(session_id=sid, task_key=key, created_at=created, ended=bool(ended), consumed=bool(consumed),
                         flagged_reason=flagged, num_calls=int(n), version=None if v is None else int(v),
                         reward=policy.resolve(by_session.get(sid, [])))
            for sid, key, created, ended, consumed, flagged, n, v in rows]


def outcomes(points: Sequence[SessionPoint]) -> list[Outcome]:
    """The points that say something about a version: rewarded, served, not faulted."""
    return [Outcome(version=p.version, at=p.created_at, reward=p.reward) for p in points
            if p.reward is not None and p.version is not None and not p.faulted]


# -- counts -------------------------------------------------------------------------------------


def queue_lengths(store: TraceStore) -> dict[str, int]:
    """How much work waits where (names and meanings in ``QUEUES``), in one statement.

    ``ready_to_train`` uses the conditions of ``TraceStore.trainable_sessions`` under the
    default ``RewardPolicy`` (a test keeps them equal). A continual cycle marks the
    sessions it claims consumed at once (so ``train --from-store`` never takes them too);
    ``trained`` counts only those whose cycle got past its update, ``in_cycle`` the rest,
    ``unusable`` those it could not replay.
    """
    has_reward = sa.exists().where(rewards.c.session_id == sessions.c.session_id)
    has_calls = sa.exists().where(calls.c.session_id == sessions.c.session_id)
    ended = sessions.c.ended_at.is_not(None)
    flagged = sessions.c.flagged_reason.is_not(None)
    claim_state = sa.select(claims.c.state).where(claims.c.session_id == sessions.c.session_id).scalar_subquery()
    in_cycle = claim_state == "claimed"
    unusable = claim_state == "unusable"
    consumed = sessions.c.consumed_by.is_not(None)
    conditions = {
        "open": ~ended,
        "awaiting_reward": sa.and_(ended, has_calls, ~has_reward, ~flagged),
        "ready_to_train": sa.and_(ended, has_calls, has_reward, ~consumed, ~flagged),
        "in_cycle": sa.and_(consumed, sa.func.coalesce(in_cycle, False)),
        "trained": sa.and_(consumed, ~sa.func.coalesce(in_cycle, False), ~sa.func.coalesce(unusable, False)),
        "unusable": sa.func.coalesce(unusable, False),
        "flagged": flagged,
    }
    session_counts = sa.select(*[sa.func.coalesce(sa.func.sum(sa.case((c, 1), else_=0)), 0).label(k)
                                 for k, c in conditions.items()])
    candidates = sa.select(sa.func.count()).where(model_versions.c.status == "candidate")

    def tx(conn: Connection) -> dict[str, int]:
        row = conn.execute(session_counts).mappings().one()
        return {**{k: int(row[k]) for k in conditions}, "candidates_undecided": int(conn.execute(candidates).scalar() or 0)}

    return _snapshot(store, tx)


def reward_counts(store: TraceStore) -> dict[str, int]:
    """Rewards stored, by source ('verifier', 'user', 'judge', ...)."""
    query = sa.select(rewards.c.source, sa.func.count()).group_by(rewards.c.source).order_by(rewards.c.source)
    return _snapshot(store, lambda conn: {str(s): int(n) for s, n in conn.execute(query).all()})


def decision_counts(store: TraceStore) -> dict[tuple[str, str, str], int]:
    """Stored decisions by (model name, action, actor)."""
    query = (sa.select(decisions.c.name, decisions.c.action, decisions.c.actor, sa.func.count())
             .group_by(decisions.c.name, decisions.c.action, decisions.c.actor))
    return _snapshot(store, lambda conn: {(str(a), str(b), str(c)): int(n) for a, b, c, n in conn.execute(query).all()})


# -- the overview ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Overview:
    """Everything the status screen and the report's top half show, read at ``taken_at``."""

    taken_at: float
    versions: list[ModelVersionRecord]
    decisions: list[DecisionRecord]
    points: list[SessionPoint]
    queues: dict[str, int]
    gateways: list[GatewayRecord] = field(default_factory=list)

    def promoted(self) -> dict[str, int]:
        """Model name -> its promoted version."""
        return {v.name: v.version for v in self.versions if v.status == "promoted"}


def read_overview(store: TraceStore, *, last_decisions: int = 10, policy: RewardPolicy | None = None) -> Overview:
    """Versions, the last decisions, every session's point, the queues and the gateways (a few reads;
    a write landing between them can make the queues one session ahead of the points)."""
    return Overview(taken_at=time.time(), versions=store.model_versions(),
                    decisions=store.decisions(limit=last_decisions), points=session_points(store, policy),
                    queues=queue_lengths(store), gateways=store.gateways())


def evidence_summary(d: DecisionRecord) -> str:
    """The decision's evidence in one line: the gate's paired statistics, or the reason."""
    ev = d.evidence or {}
    gate = ev.get("gate")
    if isinstance(gate, dict):
        cfg = gate.get("config") or {}
        parts = [str(gate.get("verdict", "?"))]
        if gate.get("mean_diff") is not None:
            parts.append(f"diff {gate['mean_diff']:+.3f}")
        if gate.get("ci_low") is not None:
            parts.append(f"low {gate['ci_low']:+.3f} vs margin -{cfg.get('margin', 0):g}")
        parts.append(f"{gate.get('n_tasks', 0)} tasks/{gate.get('n_pairs', 0)} pairs")
        if gate.get("promoted_mean") is not None and gate.get("candidate_mean") is not None:
            parts.append(f"{cfg.get('metric', 'reward')} {gate['promoted_mean']:.2f} -> {gate['candidate_mean']:.2f}")
        faults = gate.get("faults") or {}
        if any(faults.values()):
            parts.append("faults " + "/".join(f"{k} {v}" for k, v in faults.items()))
        if "baseline" in ev:
            parts.append(f"baseline v{ev['baseline']}")
        return ", ".join(parts)
    bits = [f"{k}: {v}" for k, v in ev.items() if v is not None and not isinstance(v, dict | list)]
    return "; ".join(bits) if bits else "(no evidence stored)"


def sameness_summary(d: DecisionRecord) -> str | None:
    """How alike a gate's candidate and the promoted version were: identical canary pairs and
    update groups without reward variance (``GateDecision.sameness``); None when not recorded."""
    gate = (d.evidence or {}).get("gate")
    if not isinstance(gate, dict):
        return None
    bits = []
    identical, n_pairs = gate.get("identical_pairs"), gate.get("n_pairs") or 0
    if isinstance(identical, int) and n_pairs:
        bits.append(f"{identical}/{n_pairs} canary pairs identical")
    update = gate.get("update")
    if isinstance(update, dict):
        bits.append(f"{update.get('flat_groups')}/{update.get('groups')} update groups without reward variance")
    if not bits:
        return None
    same = "INDISTINGUISHABLE from the version it was compared with: " if identical == n_pairs and n_pairs else ""
    return same + ", ".join(bits)


# -- the drill-down ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageView:
    role: str
    content: str
    tool_calls: list[str]


@dataclass(frozen=True)
class CallView:
    """One stored call as people read it (no token ids: only their counts)."""

    seq: int
    call: LLMCall
    new_messages: list[MessageView]  # the prompt's messages after its last assistant turn: this turn's input
    all_messages: list[MessageView]
    tool_calls: list[str]  # tool calls parsed from the completion, as name(args)
    invalid_tool_calls: list[str]  # why a <tool_call> block of the completion did not parse


@dataclass(frozen=True)
class SessionDetail:
    session: SessionRecord
    version: int | None
    reward: float | None
    rewards: list[RewardRecord]
    skill: Skill | None
    calls: list[CallView]
    episode: dict[str, Any]

    @property
    def success(self) -> bool | None:
        return None if self.reward is None else self.reward >= 1.0


def _content(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: keep the text ones, show others as JSON
        return "".join(p if isinstance(p, str) else str(p["text"]) if isinstance(p, dict) and "text" in p
                       else json.dumps(p, ensure_ascii=False) for p in value)
    return json.dumps(value, ensure_ascii=False)


def _message(m: dict[str, Any]) -> MessageView:
    tcs = []
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function", tc) if isinstance(tc, dict) else {}
        args = fn.get("arguments", fn.get("args", {}))
        tcs.append(f"{fn.get('name', '?')}({args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)})")
    return MessageView(role=str(m.get("role", "?")), content=_content(m.get("content")), tool_calls=tcs)


def call_view(seq: int, call: LLMCall) -> CallView:
    msgs = [_message(m) for m in call.messages]
    last_assistant = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
    _, parsed, invalid = parse_tool_calls(call.text)
    return CallView(seq=seq, call=call, new_messages=msgs[last_assistant + 1:], all_messages=msgs,
                    tool_calls=[f"{tc['name']}({json.dumps(tc['args'], ensure_ascii=False)})" for tc in parsed],
                    invalid_tool_calls=[str(tc.get("error")) for tc in invalid])


def session_details(store: TraceStore, session_ids: Sequence[str], policy: RewardPolicy | None = None) -> list[SessionDetail]:
    """The sessions with their calls, rewards and skills (ids the store lacks are skipped)."""
    policy = policy or RewardPolicy()
    out = []
    for sid in session_ids:
        session = store.get_session(sid)
        if session is None:
            continue
        traj = store.to_trajectory(sid, policy)
        rewards_ = store.rewards(sid)
        version = next((c.policy_version for c in traj.calls if c.purpose == "policy"), None)
        episode = session.metadata.get("episode") if isinstance(session.metadata.get("episode"), dict) else {}
        out.append(SessionDetail(session=session, version=version, reward=policy.resolve(rewards_), rewards=rewards_,
                                 skill=traj.skill, calls=[call_view(i, c) for i, c in enumerate(traj.calls)],
                                 episode={k: episode[k] for k in ("stop_reason", "fault", "error", "success") if k in episode}))
    return out


# -- the canary behind a decision ---------------------------------------------------------------


@dataclass(frozen=True)
class CanaryTask:
    """One canary task of a decision: each side's episodes, by seed."""

    task_id: str
    promoted: list[CanaryEpisodeRecord]
    candidate: list[CanaryEpisodeRecord]


@dataclass(frozen=True)
class CanaryView:
    """The canary episodes one decision rests on, task by task (a gate decision, a drill)."""

    decision: DecisionRecord
    promoted_version: int | None
    candidate_version: int | None
    tasks: list[CanaryTask]

    def tally(self, side: str) -> tuple[int, int, int]:
        """(successes, faults, episodes) of ``side``: 'promoted' or 'candidate'."""
        eps = [e for t in self.tasks for e in (t.promoted if side == "promoted" else t.candidate)]
        return sum(e.success and e.fault is None for e in eps), sum(e.fault is not None for e in eps), len(eps)


def canary_views(store: TraceStore, among: Sequence[DecisionRecord], *,
                 limit: int = MAX_CANARY_DECISIONS) -> list[CanaryView]:
    """The canary of the newest ``limit`` decisions of ``among`` that kept episodes, newest first.
    One count, then the episodes of those decisions only (a page never reads them all)."""
    ids = [d.decision_id for d in among]
    if not ids or limit <= 0:
        return []
    count = (sa.select(canary_episodes.c.decision_id).where(canary_episodes.c.decision_id.in_(ids))
             .group_by(canary_episodes.c.decision_id))
    with_episodes = set(_snapshot(store, lambda conn: [int(i) for i in conn.execute(count).scalars()]))
    chosen = [d for d in sorted(among, key=lambda d: d.decision_id, reverse=True) if d.decision_id in with_episodes][:limit]
    by_decision: dict[int, list[CanaryEpisodeRecord]] = {}
    for e in store.canary_episodes([d.decision_id for d in chosen]) if chosen else []:
        by_decision.setdefault(e.decision_id, []).append(e)
    views = []
    for d in chosen:
        episodes = by_decision.get(d.decision_id, [])
        tasks: dict[str, CanaryTask] = {}
        for e in sorted(episodes, key=lambda e: e.seed):
            if e.side == "anchor":  # the page compares candidate and promoted; the anchor's verdict is in the evidence
                continue
            task = tasks.setdefault(e.task_id, CanaryTask(task_id=e.task_id, promoted=[], candidate=[]))
            (task.promoted if e.side == "promoted" else task.candidate).append(e)
        version = {side: next((e.version for e in episodes if e.side == side), None) for side in ("promoted", "candidate")}
        views.append(CanaryView(decision=d, promoted_version=version["promoted"], candidate_version=version["candidate"],
                                tasks=list(tasks.values())))
    return views
