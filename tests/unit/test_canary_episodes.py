"""What is kept of each canary episode (``seed_agents.continual.canary``), bounded, and how
the report shows it: per decision, which tasks each side passed, down to the tool calls.
The store's side (round trip, one transaction with the decision, migration 5) is in
tests/store_suite.py, on SQLite and PostgreSQL."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from seed_agents.continual.canary import MAX_TEXT, MAX_TOOL_CALLS, CanaryEpisode, EpisodeTrace, ToolCallTrace, split_sides
from seed_agents.observe.data import canary_views, read_overview
from seed_agents.observe.report import build_report
from seed_agents.observe.testing import XSS, populate
from seed_agents.types import FaultKind, LLMCall, StopReason, Trajectory
from tests.unit.test_observe_report import Elements


def _borrow(i: int, **args: object) -> dict:
    return {"name": "borrow_book", "args": {"book_id": i, **args}, "id": f"c{i}"}


def test_a_trace_reads_the_final_messages_tool_calls_results_errors_and_answer():
    messages = [HumanMessage("Borrow Dune for ann."),
                AIMessage("", tool_calls=[_borrow(1, member_id="ann"), _borrow(2)]),
                ToolMessage('{"loan": 7}', tool_call_id="c1"),
                ToolMessage("Error: borrow_book failed with HTTP 409 Conflict", tool_call_id="c2", status="error"),
                AIMessage("", tool_calls=[], invalid_tool_calls=[{"name": None, "args": "{", "id": "x", "error": "not JSON"}]),
                AIMessage("Borrowed Dune (loan 7).")]
    traj = Trajectory(task_id="t", group_id="g", calls=[LLMCall(messages=[], prompt_ids=[1], completion_ids=[2],
                                                                logprobs=[-1.0])] * 3)
    trace = EpisodeTrace.of(traj, messages)
    assert [(c.name, c.args, c.result, c.error) for c in trace.tool_calls] == [
        ("borrow_book", '{"book_id": 1, "member_id": "ann"}', '{"loan": 7}', None),
        ("borrow_book", '{"book_id": 2}', None, "Error: borrow_book failed with HTTP 409 Conflict")]
    assert (trace.answer, trace.turns, trace.invalid_tool_calls, trace.stop_reason) == ("Borrowed Dune (loan 7).", 3, 1, "done")

    ended = EpisodeTrace.of(traj, messages[:2] + messages[2:3])  # the last reply's second call never ran
    assert ended.tool_calls[1].result is None and ended.tool_calls[1].error is None and ended.answer is None


def test_a_faulted_episode_is_read_from_its_recorded_calls():
    """No final state (a timeout): the last call's prompt holds every earlier tool call and
    result (Hermes text here, as SmolLM2's template renders them), its completion the last reply."""
    prompt = [{"role": "user", "content": "Borrow Dune."},
              {"role": "assistant", "content": '<tool_call>\n{"name": "search_books", "arguments": {"q": "Dune"}}\n</tool_call>'},
              {"role": "user", "content": '<tool_response>\n[{"id": 1}]\n</tool_response>'}]
    last = LLMCall(messages=prompt, prompt_ids=[1], completion_ids=[2], logprobs=[-1.0],
                   text='<tool_call>\n{"name": "borrow_book", "arguments": {"book_id": 1}}\n</tool_call>')
    traj = Trajectory(task_id="t", group_id="g", calls=[last], stop_reason=StopReason.TIMEOUT, fault=FaultKind.TIMEOUT,
                      error="episode exceeded 30s")
    episode = CanaryEpisode.of(traj, side="candidate", version=3, seed=1)
    assert [(c.name, c.result) for c in episode.trace.tool_calls] == [("search_books", '[{"id": 1}]'), ("borrow_book", None)]
    assert (episode.fault, episode.trace.error, episode.trace.stop_reason) == (FaultKind.TIMEOUT, "episode exceeded 30s", "timeout")
    assert episode.result().model_dump() == {"task_id": "t", "seed": 1, "reward": 0.0, "success": False,
                                             "fault": FaultKind.TIMEOUT, "fingerprint": episode.trace.fingerprint()}


def test_the_fingerprint_tells_episodes_that_did_the_same_apart_from_others():
    """Same tool calls and answer: the same fingerprint (results aside); another argument or answer: another."""
    search = ToolCallTrace(name="search_books", args='{"title": "Dune"}', result='[{"id": 1}]')
    same = EpisodeTrace(tool_calls=[search], answer="Found it.", turns=2)
    assert same.fingerprint() == EpisodeTrace(tool_calls=[search.model_copy(update={"result": "[]"})], answer="Found it.",
                                              turns=2).fingerprint()
    other_args = EpisodeTrace(tool_calls=[search.model_copy(update={"args": '{"title": "Emma"}'})], answer="Found it.")
    assert len({same.fingerprint(), other_args.fingerprint(), EpisodeTrace(tool_calls=[search], answer="No.").fingerprint(),
                EpisodeTrace(answer="Found it.").fingerprint()}) == 4


def test_traces_are_bounded_and_redacted():
    long = "x" * (MAX_TEXT + 1234)
    calls = [{"name": "search", "args": {"q": long}, "id": f"c{i}"} for i in range(MAX_TOOL_CALLS + 5)]
    messages = [AIMessage("", tool_calls=calls), *(ToolMessage(f"Bearer abcdefghijklmnop {long}", tool_call_id=f"c{i}")
                                                  for i in range(len(calls))), AIMessage(long)]
    trace = EpisodeTrace.of(Trajectory(task_id="t", group_id="g"), messages)
    assert len(trace.tool_calls) == MAX_TOOL_CALLS and trace.omitted_tool_calls == 5
    assert trace.answer == "x" * MAX_TEXT + "... [1234 more characters cut]"
    first = trace.tool_calls[0]
    assert first.result is not None and first.result.startswith("Bearer ***") and "abcdefghijklmnop" not in first.result
    assert all(len(t) <= MAX_TEXT + 40 for c in trace.tool_calls for t in (c.args, c.result or ""))
    assert len(trace.model_dump_json()) < 30_000  # one episode, at its caps


def test_split_sides_gives_the_gate_its_pairs():
    eps = [CanaryEpisode(side=s, version=v, task_id="t", seed=0, reward=r) for s, v, r in (("promoted", 1, 1.0), ("candidate", 2, 0.0))]
    promoted, candidate = split_sides(eps)
    assert [r.reward for r in promoted] == [1.0] and [r.reward for r in candidate] == [0.0]


def test_the_report_shows_each_decisions_canary_task_by_task(store):
    populate(store, hours=4, per_hour=3)
    ov = read_overview(store)
    views = canary_views(store, ov.decisions)
    assert [(v.decision.action, v.promoted_version, v.candidate_version) for v in views] == [("reject", 1, 2), ("promote", 0, 1)]
    rejected = views[0]
    assert [t.task_id for t in rejected.tasks] == [f"canary-{i}" for i in range(8)]
    assert rejected.tally("promoted") == (4, 0, 8) and rejected.tally("candidate") == (2, 0, 8)
    assert canary_views(store, ov.decisions, limit=1) == views[:1] and canary_views(store, []) == []

    page = build_report(store, store_label="s")
    tags = Elements(page).tags
    blocks = [a for t, a in tags if t == "details" and a.get("class") == "canary"]
    assert [(a["id"], a["data-action"]) for a in blocks] == [("canary-3", "reject"), ("canary-2", "promote")]
    assert sum(1 for t, a in tags if a.get("class") == "episode") == 2 * 8 * 2
    assert 'href="#canary-3"' in page and "candidate v2: 2/8 episodes passed" in page
    block = page.split('id="canary-3"')[1].split('class="canary"')[0]
    assert "borrow_book({&#34;book_id&#34;: 1})" in block and "I could not borrow" in block
    assert "&lt;script&gt;" in block and "<script" not in page  # a tool result is untrusted text too
    assert XSS not in page
