"""``skills collect`` with a scripted env, a fake policy backend and fake analyzers:
examples, resume after failed requests, --from-trajectories, half-written lines, the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from seed_agents.app.cli import main
from seed_agents.capture import read_jsonl
from seed_agents.chat_model import SeedChatModel, to_chat_dicts
from seed_agents.envs import EnvSuite
from seed_agents.errors import ConfigError
from seed_agents.graphs.env_agent import build_env_agent
from seed_agents.runner import RunnerConfig
from seed_agents.skills import build_analyzer_messages, episode_steps, first_user_message, parse_skill
from seed_agents.stage1.analyzers import Analyzer, AnalyzerReply
from seed_agents.stage1.collect import CollectConfig, run_collect
from seed_agents.testing import SKILL_JSON, FakeBackend, ScriptedEnv
from seed_agents.tools.textworld_analyzer import TextWorldAnalyzer
from seed_agents.types import SamplingParams, SkillExample, Task, Trajectory


class FakeSuite(EnvSuite):
    """Two-step scripted rooms; ``broken`` task ids raise on their first step. Its offline
    analyzer is TextWorld's (the scripted rooms are TextWorld-like)."""

    name = "fake"

    def __init__(self, broken: tuple[str, ...] = ()) -> None:
        self.broken = broken

    def tasks(self, split: str, n: int) -> list[Task]:
        return [Task(task_id=f"room{i}", split=split) for i in range(n)]

    def make_env(self, task: Task) -> ScriptedEnv:
        return ScriptedEnv(raise_on_step=1 if task.task_id in self.broken else None)

    def build_graph(self, llm: Any, **options: Any) -> Any:
        return build_env_agent(llm, **options)

    def offline_analyzer(self) -> Analyzer:
        return TextWorldAnalyzer()


class CountingAnalyzer(Analyzer):
    """Writes SKILL_JSON; its first ``fail_first`` requests fail (after "retries"); counts calls."""

    def __init__(self, name: str = "fake-analyzer", fail_first: int = 0) -> None:
        self.name = name
        self.fail_first = fail_first
        self.calls = 0

    async def analyze(self, messages: Any, episode: Any = None) -> AnalyzerReply:
        self.calls += 1
        n = self.calls
        await asyncio.sleep(0)
        if n <= self.fail_first:
            return AnalyzerReply(error="HTTP 503: try later", attempts=3)
        return AnalyzerReply(text=SKILL_JSON, prompt_tokens=100, completion_tokens=20, cost_usd=0.5)



@pytest.fixture
def policy(tokenizer):
    backend = FakeBackend(tokenizer, ["open door", "go north", "dance", "look"])
    return SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=SamplingParams(max_tokens=8, temperature=0.4))


def config(out: Path, **kw: Any) -> CollectConfig:
    return CollectConfig(out=out, num_tasks=2, runner=RunnerConfig(group_size=2, concurrency=4, progress=False),
                         backend={"model": "/nonexistent/policy"}, **kw)  # any real backend build would fail


def strict_lines(path: Path) -> list[SkillExample]:
    return [SkillExample.model_validate_json(line) for line in path.read_text().splitlines()]


def test_rollouts_and_rule_based_examples(tmp_path, policy):
    out = tmp_path / "run"
    summary = run_collect(config(out), suite=FakeSuite(), llm=policy)
    assert summary["episodes"] == summary["rolled_out_now"] == summary["analyzed_now"] == summary["examples"] == 4
    assert summary["valid"] == 4 and summary["parse_rate"] == 1.0 and summary["failed_requests"] == 0
    assert summary["analyzer"] == "rule-based-textworld"
    assert json.loads((out / "summary.json").read_text()) == summary
    trajs = {t.trajectory_id: t for t in read_jsonl(out / "trajectories.jsonl", Trajectory)}
    examples = strict_lines(out / "examples.jsonl")
    assert len(trajs) == 4 and {t.sample_index for t in trajs.values()} == {0, 1}
    assert all(not any(c.purpose == "analyzer" for c in t.calls) for t in trajs.values())  # no hindsight node
    assert sorted(e.example_id for e in examples) == sorted(trajs)
    for e in examples:
        t = trajs[e.trajectory_id]
        assert e.valid and e.reject_reason is None and e.analyzer == "rule-based-textworld"
        assert (e.summary, e.skill, None) == parse_skill(e.completion)
        assert (e.task_id, e.success, e.reward, e.split) == (t.task_id, t.success, t.reward, "train")
        # exactly the prompt the policy sees in training (graphs.hindsight.write_skill's defaults)
        expected = build_analyzer_messages(first_user_message(t.calls), t.success, episode_steps(t.calls))
        assert e.messages == to_chat_dicts(expected)
        assert [m["role"] for m in e.messages] == ["system", "user"]
    # a re-run plays nothing and analyzes nothing
    n_prompts = len(policy.backend.prompts)
    again = run_collect(config(out), suite=FakeSuite(), llm=policy)
    assert len(policy.backend.prompts) == n_prompts
    assert (again["rolled_out_now"], again["analyzed_now"], again["analyzed_before"], again["examples"]) == (0, 0, 4, 4)
    assert len(strict_lines(out / "examples.jsonl")) == 4


def test_failures_skip_analyzes_only_the_successes_training_will_ask_about(tmp_path, policy):
    src = tmp_path / "played"
    run_collect(config(src), suite=FakeSuite(), llm=policy)
    trajs = list(read_jsonl(src / "trajectories.jsonl", Trajectory))
    for t in trajs[:2]:  # the scripted rooms are lost by the fake policy: two of them won instead
        t.success, t.reward = True, 1.0
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(t.model_dump_json() + "\n" for t in trajs))
    out = tmp_path / "run"
    summary = run_collect(config(out, failures="skip", from_trajectories=mixed), analyzer=CountingAnalyzer())
    assert summary["skipped_failures"] == 2 and summary["analyzed_now"] == 2
    assert {e.trajectory_id for e in strict_lines(out / "examples.jsonl")} == {t.trajectory_id for t in trajs[:2]}
    every = run_collect(config(tmp_path / "all", from_trajectories=mixed), analyzer=CountingAnalyzer())
    assert (every["skipped_failures"], every["analyzed_now"]) == (0, 4)


def test_a_policy_analyzer_decodes_under_the_skill_form_training_asks_for(tmp_path, policy, tokenizer):
    """``--opening call`` and the word limits reach a policy analyzer's grammar, naming the
    tools each episode offered (training's ``write_skill`` builds the same tag)."""
    from seed_agents.backends.grammar import skill_tag

    src = tmp_path / "played"
    run_collect(config(src), suite=FakeSuite(), llm=policy)
    trajs = list(read_jsonl(src / "trajectories.jsonl", Trajectory))
    for t in trajs:
        for c in t.calls:
            c.tools = [{"type": "function", "function": {"name": "lookup"}}, {"name": "add"}]
    offered = tmp_path / "offered.jsonl"
    offered.write_text("".join(t.model_dump_json() + "\n" for t in trajs))

    class Recording(FakeBackend):
        def _complete(self, prompt_ids: list[int], params: SamplingParams) -> Any:
            tags.append(params.structural_tag)
            return super()._complete(prompt_ids, params)

    for opening, names in (("call", ["add", "lookup"]), ("words", [])):
        tags: list[Any] = []
        analyst = SeedChatModel(backend=Recording(tokenizer, SKILL_JSON), tokenizer=tokenizer, model_name="pol")
        summary = run_collect(config(tmp_path / opening, from_trajectories=offered, opening=opening, min_words=7,
                                     max_words=40, analyzer={"kind": "policy", "max_tokens": 300}), llm=analyst)
        assert summary["analyzed_now"] == len(trajs) == len(tags)
        assert set(tags) == {skill_tag(min_words=7, max_words=40, max_tokens=300, call_names=names)}


def test_the_analyzer_prompt_carries_the_configured_answer_format(tmp_path, policy):
    out = tmp_path / "run"
    run_collect(config(out, answer_format="described"), suite=FakeSuite(), llm=policy)
    trajs = {t.trajectory_id: t for t in read_jsonl(out / "trajectories.jsonl", Trajectory)}
    for e in strict_lines(out / "examples.jsonl"):
        t = trajs[e.trajectory_id]
        expected = build_analyzer_messages(first_user_message(t.calls), t.success, episode_steps(t.calls),
                                           answer_format="described")
        assert e.messages == to_chat_dicts(expected) and "<the rule to follow next time>" in e.messages[1]["content"]


def test_failed_requests_are_retried_by_the_next_run_and_never_duplicated(tmp_path, policy):
    out = tmp_path / "run"
    run_collect(config(out), suite=FakeSuite(), llm=policy, analyzer=TextWorldAnalyzer())
    (out / "examples.jsonl").unlink()  # keep the episodes, analyze them again with a flaky analyzer
    tids = {t.trajectory_id for t in read_jsonl(out / "trajectories.jsonl", Trajectory)}
    flaky = CountingAnalyzer(fail_first=2)
    first = run_collect(config(out), suite=FakeSuite(), llm=policy, analyzer=flaky)
    assert flaky.calls == 4
    assert (first["analyzed_now"], first["failed_requests"], first["valid"]) == (2, 2, 2)
    assert first["first_errors"] == ["HTTP 503: try later"]
    assert first["prompt_tokens"] == 200 and first["cost_usd"] == pytest.approx(2 * 0.5)
    done_first = {e.example_id for e in strict_lines(out / "examples.jsonl")}
    assert len(done_first) == 2 and done_first < tids  # failed requests are not written

    healthy = CountingAnalyzer()
    second = run_collect(config(out), suite=FakeSuite(), llm=policy, analyzer=healthy)
    assert healthy.calls == 2  # only the missing ones
    assert (second["analyzed_before"], second["analyzed_now"], second["failed_requests"], second["examples"]) == (2, 2, 0, 4)
    ids = [e.example_id for e in strict_lines(out / "examples.jsonl")]
    assert set(ids) == tids and len(ids) == 4  # no duplicates

    third = CountingAnalyzer()
    run_collect(config(out), suite=FakeSuite(), llm=policy, analyzer=third)
    assert third.calls == 0


def test_from_trajectories_analyzes_the_same_episodes_without_rollouts(tmp_path, policy):
    src = tmp_path / "a"
    run_collect(config(src), suite=FakeSuite(), llm=policy)
    other = CountingAnalyzer(name="openai:stronger")
    cfg = config(tmp_path / "b", from_trajectories=src / "trajectories.jsonl")
    summary = run_collect(cfg, analyzer=other)  # no suite, no policy: nothing is played
    assert summary["rolled_out_now"] == 0 and summary["analyzed_now"] == 4 and summary["analyzer"] == "openai:stronger"
    assert (tmp_path / "b" / "trajectories.jsonl").read_bytes() == (src / "trajectories.jsonl").read_bytes()
    a = {e.example_id: e for e in strict_lines(src / "examples.jsonl")}
    b = {e.example_id: e for e in strict_lines(tmp_path / "b" / "examples.jsonl")}
    assert a.keys() == b.keys() and all(a[k].messages == b[k].messages for k in a)  # same prompts, two analyzers
    # one out dir holds one analyzer's examples
    with pytest.raises(ConfigError, match="written by openai:stronger"):
        run_collect(cfg)


def test_the_policy_itself_as_analyzer(tmp_path, tokenizer):
    def reply(prompt_ids: list[int]) -> str:
        return SKILL_JSON if "Analyze the following agent episode" in tokenizer.decode(prompt_ids) else "open door"

    llm = SeedChatModel(backend=FakeBackend(tokenizer, reply), tokenizer=tokenizer, model_name="base-policy",
                        sampling=SamplingParams(max_tokens=8, temperature=0.4))
    summary = run_collect(config(tmp_path / "run", analyzer={"kind": "policy", "max_tokens": 128}), suite=FakeSuite(), llm=llm)
    assert summary["analyzer"] == "policy:base-policy" and summary["valid"] == summary["examples"] == 4
    assert summary["prompt_tokens"] > 0 and summary["completion_tokens"] > 0
    greedy = [p for p in llm.backend.prompts if "Analyze the following" in tokenizer.decode(p)]
    assert len(greedy) == 4

    # a configured name replaces the default one in every record (skills eval groups by it)
    named = run_collect(config(tmp_path / "named", analyzer={"kind": "policy", "max_tokens": 128, "name": "policy:sft"},
                               from_trajectories=tmp_path / "run" / "trajectories.jsonl"), llm=llm)
    assert named["analyzer"] == "policy:sft"
    assert {e.analyzer for e in strict_lines(tmp_path / "named" / "examples.jsonl")} == {"policy:sft"}


def test_half_written_lines_are_tolerated(tmp_path, policy):
    out = tmp_path / "run"
    run_collect(config(out), suite=FakeSuite(), llm=policy)
    ex, tr = out / "examples.jsonl", out / "trajectories.jsonl"
    # killed while writing an example: that episode is analyzed again
    lines = ex.read_text().splitlines(keepends=True)
    ex.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    summary = run_collect(config(out), suite=FakeSuite(), llm=policy)
    assert (summary["rolled_out_now"], summary["analyzed_before"], summary["analyzed_now"]) == (0, 3, 1)
    assert len(strict_lines(ex)) == 4  # every line parses again
    # killed while writing an episode (before any analysis): that episode is played again
    ex.unlink()
    tlines = tr.read_text().splitlines(keepends=True)
    tr.write_text("".join(tlines[:-1]) + tlines[-1][:100])
    n_prompts = len(policy.backend.prompts)
    summary = run_collect(config(out), suite=FakeSuite(), llm=policy)
    assert summary["rolled_out_now"] == 1 and len(policy.backend.prompts) > n_prompts
    assert summary["episodes"] == summary["examples"] == 4
    trajs = [Trajectory.model_validate_json(line) for line in tr.read_text().splitlines()]
    assert len(trajs) == 4 and {e.example_id for e in strict_lines(ex)} == {t.trajectory_id for t in trajs}


def test_errored_episodes_are_skipped_and_replayed_next_time(tmp_path, policy):
    out = tmp_path / "run"
    suite = FakeSuite(broken=("room1",))
    summary = run_collect(config(out), suite=suite, llm=policy)
    assert summary["skipped_errors"] == 2 and summary["examples"] == 2 and summary["episodes"] == 4
    again = run_collect(config(out), suite=FakeSuite(), llm=policy)  # the env is fixed now
    assert again["rolled_out_now"] == 2 and again["skipped_errors"] == 0 and again["examples"] == 4
    assert again["episodes"] == 4  # the replayed slots replace the errored records


def test_cli_collect_failed_requests_exit_1_and_the_key_never_leaks(tmp_path, policy, monkeypatch, capsys):
    from tests.unit.test_stage1_analyzers import FakeOpenAI

    src = tmp_path / "a"
    run_collect(config(src), suite=FakeSuite(), llm=policy)
    secret = "sk-live-DO-NOT-LEAK-42"
    monkeypatch.setenv("ANALYZER_KEY", secret)
    server = FakeOpenAI([(500, {}, {"error": {"message": f"bad key {secret}"}})] * 2)
    try:
        cfg = tmp_path / "collect.yaml"
        cfg.write_text("analyzer:\n  max_retries: 0\n  backoff_s: 0.01\n  price_per_mtok_prompt: 2.0\n"
                       "runner:\n  progress: false\n")
        argv = ["skills", "collect", "--config", str(cfg), "--out", str(tmp_path / "b"), "--from-trajectories",
                str(src / "trajectories.jsonl"), "--analyzer", "openai", "--analyzer-model", "judge",
                "--analyzer-base-url", server.url + "/v1", "--api-key-env", "ANALYZER_KEY", "--analyzer-concurrency", "1"]
        assert main(argv) == 1  # two requests failed: re-run to retry
        printed = capsys.readouterr().out
        assert "re-run the same command to retry them" in printed and "***" in printed
        assert main(argv) == 0  # the retry succeeds
        printed += capsys.readouterr().out
    finally:
        server.close()
    assert all(r["auth"] == f"Bearer {secret}" for r in server.requests)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["analyzed_before"] == 2 and summary["analyzed_now"] == 2 and summary["examples"] == 4
    assert summary["prompt_tokens"] == 2000 and summary["cost_usd"] == pytest.approx(2 * 1000 * 2.0 / 1e6)
    for text in [printed, *(p.read_text() for p in (tmp_path / "b").iterdir())]:
        assert secret not in text


def test_config_defaults_and_flags(tmp_path):
    from seed_agents.stage1.collect import CollectConfig as C

    cfg = C()
    assert (cfg.split, cfg.num_tasks, cfg.runner.group_size, cfg.sampling.temperature, cfg.sampling.max_tokens) == ("train", 8, 4, 0.4, 16)
    assert (cfg.agent.max_turns, cfg.agent.history, cfg.analyzer.kind, cfg.out) == (3, "chat", "rule_based", Path("runs/skills"))
    for name, field in C.model_fields.items():
        assert field.description, name
    with pytest.raises(SystemExit):
        main(["skills", "collect", "--analyzer", "nope"])
    assert main(["skills", "collect", "--analyzer", "openai", "--out", str(tmp_path / "unused")]) == 2  # no model: one clear error
    assert not (tmp_path / "unused").exists()


async def test_collect_from_inside_a_running_event_loop(tmp_path, policy):
    """A notebook cell or an async app calls the synchronous API with its loop running."""
    summary = run_collect(config(tmp_path / "run"), suite=FakeSuite(), llm=policy)
    assert summary["episodes"] == summary["valid"] == 4 and summary["failed_requests"] == 0
    trajs = read_jsonl(tmp_path / "run" / "trajectories.jsonl", Trajectory)
    assert trajs and all(c.scope.get("run") == "run" for t in trajs for c in t.calls)  # capture() labels kept
