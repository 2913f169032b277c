"""A small, populated trace store for the watch views' tests and the dashboard screenshot.

``populate(store)`` writes what a few hours of a deployed tool agent leave behind, through
the store's public API: versions promoted and rejected by the real gate on hand-made
canary episodes (kept with each decision, one tool result carrying the payload below), sessions with tool calls, rewards of several sources, skills, a session
flagged for a secret, one flagged for a fault, open and unrewarded ones, a trained batch,
and one session whose every text field carries an HTML/script payload (the report must
show it as text). The store stamps rows with the wall clock; the sessions are then
spread over ``hours`` past hours by one UPDATE of ``created_at``, so the success curves
have windows to show. Deterministic for a given ``seed``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from seed_agents.continual import (
    CanaryEpisode,
    EpisodeTrace,
    GateConfig,
    GateDecision,
    UpdateSignal,
    VersionRegistry,
    decide,
)
from seed_agents.continual.canary import ToolCallTrace, split_sides
from seed_agents.store import TraceStore
from seed_agents.store.schema import decisions, sessions
from seed_agents.types import LLMCall, SamplingParams, Skill, new_id

MODEL = "policy"
XSS = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">'
"""Put in every user-visible text field of one session; the report must escape it."""

_BOOKS = ["Dune", "Emma", "Ulysses", "Beloved", "Middlemarch", "Persuasion"]
_TOOLS = [{"type": "function", "function": {"name": "search_books", "description": "Find a book by title.",
                                           "parameters": {"type": "object", "properties": {"title": {"type": "string"}}}}},
          {"type": "function", "function": {"name": "borrow_book", "description": "Borrow a book by id.",
                                           "parameters": {"type": "object", "properties": {"book_id": {"type": "integer"}}}}}]


@dataclass(frozen=True)
class Populated:
    """What ``populate`` wrote, for assertions."""

    session_ids: list[str]
    xss_session: str
    secret_session: str
    fault_session: str
    versions: dict[int, str]  # version -> final status


def _call(rng: random.Random, messages: list[dict], text: str, version: int) -> LLMCall:
    n = rng.randint(3, 12)
    return LLMCall(call_id=new_id(), messages=messages, tools=_TOOLS, prompt_ids=[rng.randint(5, 900) for _ in range(40)],
                   completion_ids=[rng.randint(5, 900) for _ in range(n)], logprobs=[-rng.random() for _ in range(n)],
                   text=text, policy_version=version, latency_s=round(rng.uniform(0.2, 1.5), 3),
                   sampling=SamplingParams(max_tokens=128, temperature=0.7), scope={"source": "gateway"})


def _tool_call(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def _episode(store: TraceStore, rng: random.Random, version: int, success: bool, *, title: str | None = None,
             user_text: str | None = None, task_key: str | None = None) -> str:
    """One two-turn library session: search, then borrow (or give up)."""
    title = title or rng.choice(_BOOKS)
    sid = new_id()
    system = {"role": "system", "content": "You are the library assistant. Use the tools."}
    user = {"role": "user", "content": user_text or f"Please borrow '{title}' for me."}
    first = _call(rng, [system, user], _tool_call("search_books", f'{{"title": "{title}"}}'), version)
    store.add_call(sid, first, task_key=task_key or f"borrow:{title}")
    book_id = rng.randint(1, 99)
    history = [system, user,
               {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1", "function": {
                   "name": "search_books", "arguments": {"title": title}}}]},
               {"role": "tool", "tool_call_id": "c1", "content": f'[{{"id": {book_id}, "title": "{title}"}}]'}]
    second = (_tool_call("borrow_book", f'{{"book_id": {book_id}}}') if success
              else f"I could not find '{title}' on the shelf.")
    store.add_call(sid, _call(rng, history, second, version))
    return sid


def _canary_episode(side: str, version: int, i: int, reward: float) -> CanaryEpisode:
    """A canary episode of a library task: search, then borrow (a pass) or give up."""
    title = _BOOKS[i % len(_BOOKS)]
    search = ToolCallTrace(name="search_books", args=f'{{"title": "{title}"}}',
                           result=f'[{{"id": {i + 1}, "title": "{title}"}}]' if i != 3 else XSS)
    borrow = ToolCallTrace(name="borrow_book", args=f'{{"book_id": {i + 1}}}', result=f'{{"loan": {i}}}')
    trace = (EpisodeTrace(tool_calls=[search, borrow], answer=f"Borrowed '{title}'.", turns=3) if reward >= 1
             else EpisodeTrace(tool_calls=[search], answer=f"I could not borrow '{title}'.", turns=2))
    return CanaryEpisode(side=side, version=version, task_id=f"canary-{i}", seed=0,  # type: ignore[arg-type]
                         reward=reward, success=reward >= 1, trace=trace)


def _gate(promote: bool, *, baseline: int, candidate: int, n_tasks: int = 8) -> tuple[GateDecision, list[CanaryEpisode]]:
    """A real gate decision from hand-made paired canary episodes, and the episodes."""
    episodes = [_canary_episode("promoted", baseline, i, float(i % 2)) for i in range(n_tasks)]
    episodes += [_canary_episode("candidate", candidate, i, 1.0 if promote or i % 4 == 0 else 0.0) for i in range(n_tasks)]
    update = UpdateSignal(groups=4, flat_groups=1 if promote else 3)  # the reward signal of the candidate's update
    return decide(*split_sides(episodes), GateConfig(margin=0.05, resamples=1000), update=update), episodes


def populate(store: TraceStore, *, seed: int = 0, hours: int = 6, per_hour: int = 5) -> Populated:
    """Write the demo deployment into ``store`` (see the module docstring)."""
    rng = random.Random(seed)
    registry = VersionRegistry(store)
    registry.bootstrap(MODEL, "smollm2-135m")
    # hour-aligned, so the report's UTC windows hold the same sessions whatever the clock
    # says when a test runs (unaligned, an hour's sessions straddled two windows)
    now = time.time() // 3600 * 3600
    ids: list[str] = []
    when: dict[str, float] = {}
    decided: dict[int, float] = {}  # decision id -> when it should read as taken
    half = hours // 2
    for h in range(hours):
        version, p_success = (0, 0.4) if h < half else (1, 0.75)
        if h == half:  # v1 trained on the first half's traffic, then promoted by the gate
            switch_at = now - (hours - h) * 3600
            registry.add_candidate(MODEL, "runs/adapters/v1", served_name="policy-v1")
            gate, canary = _gate(True, baseline=0, candidate=1)
            decided[registry.record_decision(MODEL, 1, gate, baseline=0, canary=canary).decision_id] = switch_at
            registry.add_candidate(MODEL, "runs/adapters/v2", served_name="policy-v2")
            gate, canary = _gate(False, baseline=1, candidate=2)
            decided[registry.record_decision(MODEL, 2, gate, baseline=1, canary=canary).decision_id] = switch_at + 1800
        for i in range(per_hour):
            ok = rng.random() < p_success
            sid = _episode(store, rng, version, ok)
            store.end_session(sid)
            store.add_reward(sid, 1.0 if ok else 0.0, source="verifier", comment="borrowed" if ok else "not borrowed")
            if i == 0:
                store.add_reward(sid, 1.0 if ok else 0.5, source="user", comment="thanks!")
            if i % 2 == 0:
                store.add_skill(sid, Skill(trajectory_id=sid, success=ok, valid=True,
                                           summary="Searched, then borrowed." if ok else "Searched, then gave up.",
                                           skill="Borrow by the id the search returned." if ok
                                           else "When the search finds the book, borrow it by its id."))
            ids.append(sid)
            when[sid] = now - (hours - h) * 3600 + i * (3600 / per_hour) + 60
    # a batch the first update consumed
    store.claim_sessions(ids[: half * per_hour : 2], "update-1")
    registry.add_candidate(MODEL, "runs/adapters/v3", served_name="policy-v3")  # trained, not decided yet

    special_at = now - 600
    xss = _episode(store, rng, 1, False, user_text=f"Find {XSS}", title=XSS, task_key=f"borrow:{XSS}")
    store.end_session(xss)
    store.add_reward(xss, 0.0, source="user", comment=XSS)
    store.add_skill(xss, Skill(trajectory_id=xss, success=False, valid=True, summary=XSS, skill=XSS))
    secret = _episode(store, rng, 1, True, user_text="my key is [REDACTED], borrow Emma")
    store.flag_session(secret, "secret")
    store.end_session(secret)
    store.add_reward(secret, 1.0, source="verifier")
    fault = _episode(store, rng, 1, False)
    store.flag_session(fault, "fault: env")
    store.end_session(fault)
    store.add_reward(fault, 0.0, source="verifier")
    waiting = _episode(store, rng, 1, True)  # ended, no reward yet
    store.end_session(waiting)
    open_ = _episode(store, rng, 1, True)  # still talking
    for k, sid in enumerate((xss, secret, fault, waiting, open_)):
        when[sid] = special_at + k
        ids.append(sid)
    decided.update({d.decision_id: now - hours * 3600 for d in registry.decisions(MODEL) if d.actor == "bootstrap"})
    _backdate(store, when, decided)
    return Populated(session_ids=ids, xss_session=xss, secret_session=secret, fault_session=fault,
                     versions={v.version: v.status for v in registry.versions(MODEL)})


def _backdate(store: TraceStore, sessions_at: dict[str, float], decisions_at: dict[int, float]) -> None:
    """Spread sessions and decisions over past hours (the store stamps the wall clock when
    it writes; this demo needs history)."""
    by_session = sa.update(sessions).where(sessions.c.session_id == sa.bindparam("key")).values(
        created_at=sa.bindparam("at"))
    by_decision = sa.update(decisions).where(decisions.c.id == sa.bindparam("key")).values(
        created_at=sa.bindparam("at"))

    def tx(conn: Connection) -> None:
        conn.execute(by_session, [{"key": k, "at": t} for k, t in sessions_at.items()])
        conn.execute(by_decision, [{"key": k, "at": t} for k, t in decisions_at.items()])

    store._write(tx)
