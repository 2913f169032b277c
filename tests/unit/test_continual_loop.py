"""The continual loop end to end on CPU: a tiny random model (local backend), the demo
library service as production, shadow replays, a LoRA update per cycle, the canary on a
fresh in-process library per episode, the gate, and the store's accounting.

The tiny model writes gibberish, so every episode scores 0 on both sides: the gate sees
a zero difference and promotes (a copy is "not worse"); the point here is the plumbing and
the exactly-once bookkeeping. The verdicts themselves are tested in test_gate.py.
"""

from __future__ import annotations

import io
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

from examples.library_service import LIBRARY_TASKS, DemoServer, library_reward  # noqa: E402
from seed_agents.app.continual import ContinualLoop, cycle_overview  # noqa: E402
from seed_agents.app.continual_config import ContinualConfig  # noqa: E402
from seed_agents.store import TraceStore  # noqa: E402
from seed_agents.types import LLMCall, Task  # noqa: E402


def seed_sessions(store: TraceStore, n: int, *, start: int = 0, task: bool = True) -> list[str]:
    """``n`` ended, rewarded sessions of library tasks, as the gateway and a verifier leave them."""
    sids = []
    for i in range(start, start + n):
        spec = LIBRARY_TASKS[i % len(LIBRARY_TASKS)]
        sid = store.create_session(f"sess-{i:03d}", task_key=spec["task_id"], metadata={"task": spec} if task else {})
        # without a task: a conversation with no user message, so none can be derived either
        messages = [{"role": "user", "content": spec["data"]["question"]}] if task else [{"role": "system", "content": "hi"}]
        store.add_call(sid, LLMCall(call_id=f"call-{i:03d}", messages=messages,
                                    prompt_ids=[1, 2, 3], completion_ids=[4], logprobs=[-0.5]))
        store.add_reward(sid, float(i % 2), source="user")
        store.end_session(sid)
        sids.append(sid)
    return sids


def make_config(tmp_path: Path, tiny_model_dir: str, prod_url: str, **over: Any) -> ContinualConfig:
    canary = tmp_path / "canary.jsonl"
    canary.write_text("".join(json.dumps(t) + "\n" for t in LIBRARY_TASKS[:2]))
    raw: dict[str, Any] = {
        "name": "library-agent", "store": f"sqlite:///{tmp_path / 'traces.db'}", "out": str(tmp_path / "run"),
        "backend": {"kind": "local", "model": tiny_model_dir},
        "sampling": {"max_tokens": 6, "temperature": 1.0},
        "skills": {"source": "self", "max_tokens": 16},
        "trainer": {"learning_rate": 1e-3, "lora_r": 4, "kl_coef": 0.0, "gradient_checkpointing": False},
        "runner": {"concurrency": 4, "progress": False},
        "agent": {"tools": {"base_url": prod_url, "allow_hosts": ["127.0.0.1"]}, "max_turns": 2,
                  "reward": "examples.library_service:library_reward"},
        "replay": {"mode": "shadow", "read_source": "live", "live_reads_per_s": 50},
        "sessions_per_cycle": 2, "group_size": 2,
        "canary": {"tasks": str(canary), "seeds": 1, "sandbox_app": "examples.library_service:create_app"},
        "gate": {"min_tasks": 2, "resamples": 200},
        "min_signal_groups": 0,  # the tiny model scores 0 everywhere: train anyway, the plumbing is the point
        **over,
    }
    return ContinualConfig.model_validate(raw)


@pytest.fixture
def prod() -> Iterator[DemoServer]:
    with DemoServer() as server:
        yield server


def test_cycles_claim_train_gate_and_account_for_every_session(tmp_path, tiny_model_dir, prod, capsys):
    cfg = make_config(tmp_path, tiny_model_dir, prod.url)
    store = TraceStore.open(cfg.store)
    sids = seed_sessions(store, 3) + seed_sessions(store, 1, start=3, task=False)  # the last one cannot be replayed
    lines: list[str] = []
    loop = ContinualLoop(cfg, store=store, log=lines.append)
    outcomes = loop.run(cycles=2)

    assert [o.state for o in outcomes] == ["decided", "decided"]
    claims = store.claim_states()
    assert set(claims) == set(sids)  # every session claimed, each by exactly one cycle
    assert [cid for cid, _, _ in claims.values()].count(outcomes[0].cycle_id) == 2
    assert claims["sess-003"][1:] == ("unusable", "no task: the session has no user message and no metadata['task']; it cannot be replayed")
    assert sorted(s for s, (_, state, _) in claims.items() if state == "trained") == sids[:3]
    queue, cycles = cycle_overview(store, cfg.name)
    assert queue.model_dump() == {"unclaimed": 0, "claimed": 0, "trained": 3, "unusable": 1}
    assert [(c.state, c.attempts, c.base_version, c.candidate_version) for c in cycles] == [
        ("decided", 1, 0, 1), ("decided", 1, 1, 2)]  # the second cycle trains from the first's promoted adapter

    decisions = {d.version: d for d in loop.registry.decisions(cfg.name)}
    for c in cycles:
        d = decisions[c.candidate_version]
        assert d.decision_id == c.decision_id and d.actor == "gate"
        assert d.evidence["gate"]["n_tasks"] == 2 and d.evidence["baseline"] == c.base_version
        episodes = store.canary_episodes([d.decision_id])  # kept with the decision: 2 tasks x 1 seed x 2 sides
        assert sorted((e.side, e.version) for e in episodes) == [("candidate", c.candidate_version)] * 2 + \
            [("promoted", c.base_version)] * 2
        assert all(e.trace["turns"] >= 1 for e in episodes)
    assert loop.registry.pending(cfg.name) == []
    assert loop.registry.resolve(cfg.name).version == 2  # type: ignore[union-attr]
    v2 = next(v for v in store.model_versions(cfg.name) if v.version == 2)
    assert Path(v2.path, "adapter_model.safetensors").is_file() and v2.metadata["served_name"] == "library-agent-v2"
    # the optimizer travels with the adapter: cycle 2's Adam took its second step, not a first
    steps = {int(s["step"]) for s in torch.load(Path(v2.path, "optimizer.pt"), weights_only=True)["state"].values()}
    assert steps == {2}

    replays = [json.loads(x) for x in (cfg.out / "cycles" / str(cycles[0].cycle_id) / "replays.jsonl").read_text().splitlines()]
    assert len(replays) == 4 and {r["metadata"]["session_id"] for r in replays} == {"sess-000", "sess-001"}
    assert all(r["calls"] and r["calls"][0]["policy_version"] == 0 for r in replays)  # played by the promoted version
    assert prod.log.mutating() == 0  # no replay or canary episode wrote to production
    assert len(lines) == 2 and lines[0].startswith(f"cycle {cycles[0].cycle_id}: 2 sessions -> 4 replays")
    assert "promote" in lines[0] and lines[1].endswith("s)") and "v2 serves" in lines[1]
    # every canary pair and every update group alike: the decision says the candidate changed nothing
    gate = decisions[cycles[0].candidate_version].evidence["gate"]
    assert gate["update"] == {"groups": 2, "flat_groups": 2} and gate["identical_pairs"] is not None
    assert "2/2 update groups without reward variance" in lines[0]
    # not a terminal: one line per phase on stderr (issue 66: seven minutes of replays printed nothing)
    phases = [x.split(": ", 1)[1] for x in capsys.readouterr().err.splitlines() if x.startswith("cycle ")]
    assert [re.sub(r"\(\d+s\)|in \d+s", "", x).strip() for x in phases] == [
        "replaying 2 sessions 2 times each with v0", "replays 4/4 done", "update on 2 groups (0 with unequal rewards) done",
        "canary 4/4 done",  # the second cycle: one session cannot be replayed
        "replaying 1 session 2 times each with v1", "replays 2/2 done", "update on 1 group (0 with unequal rewards) done",
        "canary 4/4 done"]

    assert loop.step() is None  # nothing waits: no cycle opened
    assert len(store.cycles(cfg.name)) == 2
    loop.close()


def test_with_an_anchor_margin_the_first_version_plays_beside_every_later_canary(tmp_path, tiny_model_dir, prod):
    """Cycle 1 compares v1 with v0, which is also the anchor: two sides. Cycle 2 compares v2
    with v1 and, as a third side on the same tasks and seeds, with the anchor v0; the
    decision's evidence holds both checks and the store every episode, the page only the
    two it compares."""
    from seed_agents.observe.data import canary_views

    cfg = make_config(tmp_path, tiny_model_dir, prod.url, gate={"min_tasks": 2, "resamples": 200, "anchor_margin": 0.1})
    store = TraceStore.open(cfg.store)
    seed_sessions(store, 4)
    loop = ContinualLoop(cfg, store=store, log=lambda _: None)
    outcomes = loop.run(cycles=2)
    assert [o.state for o in outcomes] == ["decided", "decided"]
    decisions = sorted((d for d in loop.registry.decisions(cfg.name) if d.actor == "gate"), key=lambda d: d.decision_id)
    for d, sides in zip(decisions, ([("candidate", 1), ("promoted", 0)], [("anchor", 0), ("candidate", 2), ("promoted", 1)])):
        episodes = store.canary_episodes([d.decision_id])
        assert sorted({(e.side, e.version) for e in episodes}) == sides and len(episodes) == 2 * len(sides)
        anchor = d.evidence["gate"]["anchor"]
        assert anchor["n_tasks"] == 2 and anchor["n_pairs"] == 2 and "vs the anchor" in d.summary
    view = canary_views(store, decisions)[0]  # newest first: cycle 2
    assert (view.promoted_version, view.candidate_version) == (1, 2)
    assert all(len(t.promoted) == len(t.candidate) == 1 for t in view.tasks)
    loop.close()


def test_a_resumed_cycle_keeps_its_sessions_and_never_decides_without_a_canary(tmp_path, tiny_model_dir, prod):
    """State by state, as a restarted process finds it (the SIGKILL test does it for real).
    Without carry_optimizer no optimizer state is kept with an adapter."""
    cfg = make_config(tmp_path, tiny_model_dir, prod.url, carry_optimizer=False)
    store = TraceStore.open(cfg.store)
    seed_sessions(store, 4)
    loop = ContinualLoop(cfg, store=store, log=lambda _: None)
    # a process claimed 2 sessions and died mid-replay: the restart trains on those 2, no others
    cycle, mine = store.start_cycle(cfg.name, base_version=0, limit=2)  # type: ignore[misc]
    outcome = loop.step()
    assert outcome is not None and outcome.cycle_id == cycle.cycle_id and outcome.resumed_from == "claimed"
    assert sorted(store.cycle_sessions(cycle.cycle_id, "trained")) == sorted(mine)
    assert store.get_cycle(cycle.cycle_id).attempts == 2
    assert not Path(store.model_versions(cfg.name)[1].path, "optimizer.pt").exists()

    # the next one died after its candidate was loaded: the restart evaluates, then decides
    nxt, _ = store.start_cycle(cfg.name, base_version=1, limit=2)  # type: ignore[misc]
    store.finish_training(nxt.cycle_id, path=str(Path(store.model_versions(cfg.name)[1].path)))
    store.advance_cycle(nxt.cycle_id, ("trained",), "loaded")
    assert loop.registry.resolve(cfg.name).version == 1  # type: ignore[union-attr] - the loaded candidate does not serve
    outcome = loop.step()
    assert outcome is not None and outcome.resumed_from == "loaded" and outcome.decision is not None
    assert outcome.decision.n_tasks == 2  # decided on a complete canary made after the restart
    assert store.get_cycle(nxt.cycle_id).state == "decided"
    loop.close()


def test_a_carried_optimizer_keeps_its_moments_and_this_runs_learning_rate(tmp_path) -> None:
    from seed_agents.app.continual import load_optimizer_state
    from seed_agents.errors import ContinualError

    def adam(lr: float) -> tuple[torch.nn.Linear, torch.optim.Adam]:
        torch.manual_seed(0)
        layer = torch.nn.Linear(3, 2)
        return layer, torch.optim.Adam(layer.parameters(), lr=lr)

    layer, opt = adam(0.1)
    layer(torch.ones(1, 3)).sum().backward()
    opt.step()
    opt.param_groups[0]["lr"] = 0.0  # what a linear decay leaves after its last step
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    _, fresh = adam(0.3)
    load_optimizer_state(fresh, tmp_path / "optimizer.pt")
    assert fresh.param_groups[0]["lr"] == 0.3  # this cycle's rate, not the stored 0
    saved, loaded = opt.state_dict()["state"], fresh.state_dict()["state"]
    assert all(torch.equal(saved[k]["exp_avg"], loaded[k]["exp_avg"]) and int(loaded[k]["step"]) == 1 for k in saved)
    other = torch.optim.Adam(torch.nn.Linear(4, 2).parameters())  # same count, other shapes: one clear error
    with pytest.raises(ContinualError, match="moment for a"):
        load_optimizer_state(other, tmp_path / "optimizer.pt")
    fewer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2, 3))])  # another count
    with pytest.raises(ContinualError, match="does not fit"):
        load_optimizer_state(fewer, tmp_path / "optimizer.pt")


def test_library_reward_checks_the_outcome() -> None:
    from langchain_core.messages import AIMessage, ToolMessage

    task = Task.model_validate(LIBRARY_TASKS[0])
    call = {"name": "borrow_book", "args": {"book_id": 1, "member_id": "ann", "days": 14}, "id": "t1"}
    ok = [AIMessage("", tool_calls=[call]), ToolMessage('{"id": 1}', tool_call_id="t1")]
    failed = [AIMessage("", tool_calls=[call]), ToolMessage("HTTP 409", tool_call_id="t1", status="error")]
    wrong = [AIMessage("", tool_calls=[{**call, "args": {"book_id": 2, "member_id": "ann"}}]), ok[1]]
    assert [library_reward(task, {"messages": m}) for m in (ok, failed, wrong, [])] == [1.0, 0.0, 0.0, 0.0]
    year = Task.model_validate(LIBRARY_TASKS[2])
    assert library_reward(year, {"answer": "It came out in 1951."}) == 1.0 and library_reward(year, {"answer": "1950"}) == 0.0


def test_config_errors_are_one_line(tmp_path, tiny_model_dir) -> None:
    from seed_agents.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    tools = {"base_url": "http://127.0.0.1:8000", "allow_hosts": ["127.0.0.1"]}
    path.write_text(json.dumps({"store": "sqlite:///x.db", "agent": {"tools": tools, "reward": "m:f"},
                                "canary": {"tasks": "t.jsonl"}, "trainer": {"lora_r": None}}))
    with pytest.raises(ConfigError, match="lora_r is required") as info:
        load_config(ContinualConfig, path, {})
    assert "\n" not in str(info.value)


def test_the_tools_and_replay_sections_are_checked_when_the_config_loads(tmp_path) -> None:
    """Typed sections: a tools section without its URL, or a replay that could write to
    production, is the config's one-line error before the loop opens anything."""
    from seed_agents.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    base = {"store": "sqlite:///x.db", "agent": {"tools": {}, "reward": "m:f"}, "canary": {"tasks": "t.jsonl"}}
    path.write_text(json.dumps(base))
    with pytest.raises(ConfigError, match="agent.tools.base_url: Field required") as info:
        load_config(ContinualConfig, path, {})
    assert "\n" not in str(info.value)
    tools = {"base_url": "http://127.0.0.1:8000", "allow_hosts": ["127.0.0.1"]}
    path.write_text(json.dumps({**base, "agent": {"tools": tools, "reward": "m:f"}, "replay": {"mode": "record"}}))
    with pytest.raises(ConfigError, match="replay.mode must be shadow"):
        load_config(ContinualConfig, path, {})
    path.write_text(json.dumps({**base, "agent": {"tools": tools, "reward": "m:f"}, "replay": {"live_reads_per_s": 1.0}}))
    cfg = load_config(ContinualConfig, path, {})
    assert cfg.replay.mode == "shadow" and cfg.agent.tools.base_url == "http://127.0.0.1:8000"


def signal_reward(task: Task, state: dict[str, Any]) -> float:
    """A reward with variance where the task asks for it (``data["signal"]``), else 0: a
    group with unequal rewards from a model that solves nothing."""
    return random.random() if task.data.get("signal") else 0.0


def recorded_session(store: TraceStore, i: int, *, signal: bool = False, max_tokens: int = 5,
                     temperature: float = 0.3, tool_choice: str = "auto") -> str:
    """An ended, rewarded library session whose calls recorded their sampling, as the gateway records them."""
    from seed_agents.transcript import record_transcript, transcript_of
    from seed_agents.types import SamplingParams

    spec = LIBRARY_TASKS[i % len(LIBRARY_TASKS)]
    task = {**spec, "data": {**spec["data"], "signal": signal}}
    sid = store.create_session(f"rec-{i:03d}", task_key=spec["task_id"], metadata={"task": task})
    messages = [{"role": "user", "content": spec["data"]["question"]}]
    call = LLMCall(call_id=f"rec-call-{i:03d}", messages=messages, prompt_ids=[1, 2, 3], completion_ids=[4],
                   logprobs=[-0.5], sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature),
                   scope={"source": "gateway", "tool_choice": tool_choice})
    turn = store.add_call(sid, call)
    record_transcript(store, sid, transcript_of(messages), call=call, turn=turn)
    store.add_reward(sid, 1.0, source="user")
    store.end_session(sid)
    return sid


def test_replays_sample_as_the_deployment_did_unless_the_config_says_otherwise(tmp_path, tiny_model_dir, prod):
    """Issue 66: the loop's own max_tokens cut forced calls the deployment finished. Left out
    of the config, max_tokens, temperature and tool_choice are each session's, as recorded;
    set, they win, and the loop says once, in one line, where they differ from the deployment."""
    from seed_agents.transcript import DeployedSampling

    raw = make_config(tmp_path, tiny_model_dir, prod.url, min_signal_groups=1).model_dump(mode="json", exclude_unset=True)
    del raw["sampling"]
    cfg = ContinualConfig.model_validate(raw)
    assert (cfg.sampling.max_tokens, cfg.sampling.temperature) == (512, 0.7)  # no record: the gateway's budget
    store = TraceStore.open(cfg.store)
    recorded_session(store, 0, tool_choice="search_books")
    recorded_session(store, 1, max_tokens=7, temperature=0.0)
    lines: list[str] = []
    loop = ContinualLoop(cfg, store=store, log=lines.append)
    (outcome,) = loop.run(once=True)
    assert outcome.state == "skipped"  # the tiny model solves nothing: no signal, no update (tested below)
    replays = [json.loads(x) for x in (cfg.out / "cycles" / "1" / "replays.jsonl").read_text().splitlines()]
    firsts = {(r["metadata"]["session_id"], r["calls"][0]["sampling"]["max_tokens"],
               r["calls"][0]["sampling"]["temperature"], r["calls"][0]["messages"][-1]["content"]) for r in replays}
    assert firsts == {("rec-000", 5, 0.3, '<tool_call>\n{"name": "search_books", "arguments":'),
                      ("rec-001", 7, 0.0, LIBRARY_TASKS[1]["data"]["question"])}
    assert not any(x.startswith("warning") for x in lines)
    # the canary, which plays no session, samples as most of the cycle's sessions did
    play = cfg.play(DeployedSampling(max_tokens=7, temperature=0.0, tool_choice="required"), canary=True)
    assert (play.sampling.max_tokens, play.sampling.temperature, play.tool_choice) == (7, 0.0, "required")
    loop.close()

    # set in the config: the config wins, and one line says where it differs from the deployment
    cfg = make_config(tmp_path, tiny_model_dir, prod.url, min_signal_groups=1, agent={
        **raw["agent"], "tool_choice": "borrow_book"}, canary={**raw["canary"], "temperature": 0.7})
    store = TraceStore.open(cfg.store)
    recorded_session(store, 2, tool_choice="search_books")
    recorded_session(store, 3, max_tokens=7, temperature=0.0)
    recorded_session(store, 4, tool_choice="search_books")
    recorded_session(store, 5)
    lines = []
    loop = ContinualLoop(cfg, store=store, log=lines.append)
    assert [o.state for o in loop.run(cycles=2)] == ["skipped", "skipped"]
    warnings = [x for x in lines if x.startswith("warning")]
    assert len(warnings) == 1 and "sampling.max_tokens 6 where the deployment sent 5" in warnings[0], lines
    assert "agent.tool_choice borrow_book where the deployment sent search_books" in warnings[0]
    assert "sampling.temperature 1.0 where the deployment sent 0.3" in warnings[0]
    assert "canary.temperature 0.7 where the deployment sent 0.0" in warnings[0]
    replays = [json.loads(x) for x in (cfg.out / "cycles" / "2" / "replays.jsonl").read_text().splitlines()]
    assert {(r["calls"][0]["sampling"]["max_tokens"], r["calls"][0]["messages"][-1]["content"]) for r in replays} == {
        (6, '<tool_call>\n{"name": "borrow_book", "arguments":')}
    loop.close()


def test_a_cycle_without_enough_reward_signal_does_not_train(tmp_path, tiny_model_dir, prod):
    """Issue 66: 5 of 6 groups without reward variance still made a candidate. Below
    min_signal_groups (groups with unequal rewards) the cycle is skipped: no candidate, the
    sessions without variance spent (unusable, with why), the others back in the queue."""
    cfg = make_config(tmp_path, tiny_model_dir, prod.url, min_signal_groups=2,
                      agent={"tools": {"base_url": prod.url, "allow_hosts": ["127.0.0.1"]}, "max_turns": 2,
                             "reward": "tests.unit.test_continual_loop:signal_reward"})
    store = TraceStore.open(cfg.store)
    flat, varied = recorded_session(store, 0), recorded_session(store, 1, signal=True)
    lines: list[str] = []
    loop = ContinualLoop(cfg, store=store, log=lines.append, progress=io.StringIO())
    (outcome,) = loop.run(once=True)
    assert (outcome.state, outcome.candidate_version, outcome.unusable, outcome.released) == ("skipped", None, 1, 1)
    assert "1 of 2 groups had unequal rewards, fewer than min_signal_groups 2: skipped without training, 1 session " \
           "queued again" in lines[-1]
    claims = store.claim_states()
    assert claims == {flat: (1, "unusable", "no reward variance: its 2 clean replays all scored 0")}
    assert [s.session_id for s in store.trainable_sessions()] == [varied]  # back in the queue, nothing lost
    assert store.get_cycle(1).metadata["skipped"] == {
        "reason": "1 of 2 groups had unequal rewards, fewer than min_signal_groups 2", "unusable": 1, "released": 1}
    assert [v.version for v in store.model_versions(cfg.name)] == [0]  # nothing trained
    loop.close()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_each_phase_shows_a_bar(tmp_path, tiny_model_dir, prod):
    """Issue 66: a bar per phase where stderr is a terminal (no per-phase lines then);
    runner.progress false: lines even there."""
    cfg = make_config(tmp_path, tiny_model_dir, prod.url, min_signal_groups=1, runner={"concurrency": 4})
    store = TraceStore.open(cfg.store)
    seed_sessions(store, 2)
    shown = _Terminal()
    loop = ContinualLoop(cfg, store=store, log=lambda _: None, progress=shown)
    assert [o.state for o in loop.run(once=True)] == ["skipped"]
    loop.close()
    assert "cycle 1: replays" in shown.getvalue() and "4/4" in shown.getvalue() and "\r" in shown.getvalue()
    assert "done" not in shown.getvalue()

    cfg = make_config(tmp_path, tiny_model_dir, prod.url, min_signal_groups=1, store=f"sqlite:///{tmp_path / 'other.db'}")
    assert not cfg.runner.progress
    store = TraceStore.open(cfg.store)
    seed_sessions(store, 2)
    shown = _Terminal()
    loop = ContinualLoop(cfg, store=store, log=lambda _: None, progress=shown)
    loop.run(once=True)
    loop.close()
    assert "\r" not in shown.getvalue() and "cycle 1: replays 4/4 done" in shown.getvalue()
