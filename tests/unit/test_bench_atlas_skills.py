"""bench/atlas_skills.py's own parts: the oracle analyzer answers the real analyzer prompt
with a skill that parses and names the task's calls, and the margin's interval resamples
tasks, not episodes."""

from __future__ import annotations

import pytest

from bench.atlas_skills import GENERIC_SUCCESS, EpisodeSkills, OracleSkills, bootstrap_margin, oracle_skill
from examples.atlas_tasks import make_tasks
from seed_agents.skills import build_analyzer_messages, episode_steps, parse_skill
from seed_agents.types import LLMCall


@pytest.mark.parametrize("style", ["specific", "generic"])
def test_the_oracle_answers_the_analyzer_prompt_with_a_valid_skill(style):
    task = make_tasks("train", per_level=1, levels=[1])[0]
    messages = build_analyzer_messages(task.data["question"], False, [("prompt", "reply")])
    reply = OracleSkills(style=style).invoke(messages)
    _, skill, reason = parse_skill(reply.content)
    assert reason is None
    (lookup, add) = task.data["calls"]
    named = f'"{lookup["args"]["place"]}"' in skill and f'a={add["args"]["a"]}' in skill
    assert named is (style == "specific") and skill.startswith("Call lookup")


def test_the_oracle_refuses_a_prompt_without_an_atlas_question():
    with pytest.raises(ValueError, match="0 atlas questions"):
        OracleSkills().invoke(build_analyzer_messages("Go north.", True, []))


def test_oracle_skills_read_the_manifest_not_the_outcome():
    data = {"calls": [{"name": "lookup", "args": {"place": "Malam", "field": "area"}}]}
    assert oracle_skill(data, "specific") == ('Call lookup with place "Malam" and field "area", '
                                              "then give the number it returns as the final answer.")


def _forced(question: str, *continuations: str) -> list[LLMCall]:
    """Policy calls as capture records them with a forced first turn: the opening
    ('<tool_call>\\n{"name": "') is the prompt's last message, the completion continues it."""
    opening = '<tool_call>\n{"name": "'
    calls = []
    for i, text in enumerate(continuations):
        messages = [{"role": "user", "content": question}]
        if i == 0:
            messages.append({"role": "assistant", "content": opening})
        else:
            messages.append({"role": "tool", "content": "<tool_response>\n7\n</tool_response>", "tool_call_id": "c"})
        calls.append(LLMCall(messages=messages, prompt_ids=[1], completion_ids=[2], logprobs=[-0.1], text=text))
    return calls


def _episode_skill(calls: list[LLMCall], success: bool, failures: str = "name") -> tuple[str, str | None]:
    messages = build_analyzer_messages(calls[0].messages[0]["content"], success, episode_steps(calls))
    _, skill, reason = parse_skill(EpisodeSkills(failures=failures).invoke(messages).content)
    return skill, reason


def test_episode_skills_read_the_calls_and_the_outcome_off_the_episode():
    """No manifest: a success's skill is the calls it made (for a right lookup, the oracle's
    own sentence); a failure's names the calls that did not answer, or is left out."""
    task = make_tasks("train", per_level=1, levels=[0])[0]
    args = task.data["calls"][0]["args"]
    right = f'lookup", "arguments": {{"place": "{args["place"]}", "field": "{args["field"]}"}}}}\n</tool_call>'
    episode = _forced(task.data["question"], right, "It is 7.")
    assert _episode_skill(episode, True) == (oracle_skill(task.data, "specific"), None)
    assert _episode_skill(episode, False) == (
        f'Calling lookup with place "{args["place"]}" and field "{args["field"]}" did not answer this question.', None)
    skill, reason = _episode_skill(episode, False, failures="none")
    assert skill == "" and reason.startswith("skill too short")
    # the control: one sentence on every success, nothing of the episode in it
    messages = build_analyzer_messages(task.data["question"], True, episode_steps(episode))
    generic = EpisodeSkills(failures="none", successes="generic")
    assert parse_skill(generic.invoke(messages).content)[1:] == (GENERIC_SUCCESS, None)
    assert parse_skill(generic.invoke(build_analyzer_messages("Q?", False, episode_steps(episode))).content)[1] == ""
    two = _forced("What is 3 + 4 squared?", 'add", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
                  '<tool_call>\n{"name": "multiply", "arguments": {"a": 7, "b": 7}}\n</tool_call>', "49")
    assert _episode_skill(two, True)[0] == ('Call add with a "3" and b "4", then call multiply with a "7" and b "7", '
                                            "then give the number it returns as the final answer.")
    assert _episode_skill(_forced("Q?", "not a call"), False)[0] == "The episode made no tool call that parsed."
    with pytest.raises(ValueError, match="not an analyzer prompt"):
        EpisodeSkills().invoke("What is the area of Malam?")


def test_the_bench_offers_the_episode_rule_as_an_analyzer_that_skills_collect_can_load(capsys):
    """``--analyzers episode``: the learning curve's seed-episode writer, through the same
    LangChain spec ``skills collect`` imports; the default list keeps the stored result's
    three, and a name outside the list is one clear line."""
    from bench.atlas_skills import analyzer_config, build_parser, main
    from seed_agents.imports import load_object

    args = build_parser().parse_args(["--analyzers", "episode"])
    cfg = analyzer_config("episode", args)
    assert cfg["kind"] == "langchain" and load_object(cfg["spec"]) is EpisodeSkills
    assert EpisodeSkills(**cfg["kwargs"]).failures == "name"
    assert build_parser().parse_args([]).analyzers == "policy,oracle-specific,oracle-generic"
    with pytest.raises(SystemExit):
        main(["--analyzers", "episodes"])
    assert "--analyzers: a comma list of policy, oracle-specific, oracle-generic, episode" in capsys.readouterr().err


@pytest.mark.parametrize("answer_format", ["described", "workflow"])
def test_policy_with_another_answer_format_is_the_policy_asked_through_collects_config(answer_format):
    from bench.atlas_skills import ANALYZERS, build_parser, collect_config
    from seed_agents.stage1.collect import CollectConfig

    name = f"policy-{answer_format}"
    args = build_parser().parse_args(["--analyzers", f"policy,{name}"])
    paper, other = collect_config("policy", args), collect_config(name, args)
    assert name in ANALYZERS and "answer_format" not in paper and other["answer_format"] == answer_format
    assert {**other["analyzer"], "name": "policy"} == paper["analyzer"]  # the same writer, another name
    cfg = CollectConfig.model_validate({**other, "out": "x", "from_trajectories": "t.jsonl"})
    assert cfg.answer_format == answer_format and cfg.analyzer.name == name


def test_copies_example_counts_valid_skills_that_open_with_the_placeholder():
    from bench.atlas_skills import copies_example

    skills = [{"valid": True, "skill": "string. This is a task that needs effort", "summary": "string"},
              {"valid": True, "skill": "Call lookup with the place first.", "summary": "String theory"},
              {"valid": True, "skill": "Call lookup, then answer with its value.", "summary": "Looked it up."},
              {"valid": True, "skill": "Stringent checks: call lookup once.", "summary": "Done."},
              {"valid": False, "skill": "string", "summary": "string"}]
    assert copies_example(skills) == 0.5  # the invalid one is not counted; "Stringent" is a word of its own
    assert copies_example([{"valid": False, "skill": "", "summary": ""}]) is None


def _episode(task, success, delta):
    return {"task_id": task, "success": success, "delta": delta}


def test_the_margin_interval_resamples_tasks():
    # every task: successes +0.1, failures -0.1, so every resample of tasks gives a margin of 0.2
    episodes = [_episode(f"t{i}", s, 0.1 if s else -0.1) for i in range(5) for s in (True, False, False)]
    lo, hi = bootstrap_margin(episodes)
    assert lo == pytest.approx(0.2) and hi == pytest.approx(0.2)
    # one outcome only: no margin, no interval
    assert bootstrap_margin([_episode("t", True, 0.1)]) is None
    # tasks that disagree widen it
    wide = episodes + [_episode("t9", True, -0.5), _episode("t9", False, 0.5)]
    lo, hi = bootstrap_margin(wide)
    assert lo < 0.2 - 1e-9 and hi == pytest.approx(0.2)


def test_training_can_take_its_skills_from_the_oracle_as_a_langchain_chat_model():
    """``skills.chat_model``: the hindsight node asks the oracle through the stage-1
    LangChain analyzer (paced, retried) and gets a skill that parses; a bad path or a
    source other than external is one clear error."""
    import asyncio

    from pydantic import ValidationError

    from seed_agents.app.policy import build_analyzer
    from seed_agents.config import TrainConfig
    from seed_agents.errors import ConfigError
    from seed_agents.graphs.hindsight import write_skill
    from seed_agents.stage1.analyzers import LangChainAnalyzer

    skills = {"source": "external", "chat_model": "bench.atlas_skills:OracleSkills",
              "chat_model_kwargs": {"style": "specific"}}
    analyzer = build_analyzer(TrainConfig(skills=skills), policy=None)
    assert isinstance(analyzer, LangChainAnalyzer)
    task = make_tasks("train", per_level=1, levels=[0])[0]
    skill = asyncio.run(write_skill(analyzer, [], task.data["question"], False, trajectory_id="t", task_id="k"))
    assert skill.valid and f'"{task.data["calls"][0]["args"]["place"]}"' in skill.skill
    # the episode-rule analyzer takes the same road, and reads the calls the hindsight node passes it
    ruled = build_analyzer(TrainConfig(skills={**skills, "chat_model": "bench.atlas_skills:EpisodeSkills",
                                               "chat_model_kwargs": {"failures": "name"}}), policy=None)
    args = task.data["calls"][0]["args"]
    right = f'lookup", "arguments": {{"place": "{args["place"]}", "field": "{args["field"]}"}}}}\n</tool_call>'
    skill = asyncio.run(write_skill(ruled, _forced(task.data["question"], right, "7"), task.data["question"], True,
                                    trajectory_id="t", task_id="k"))
    assert skill.valid and skill.skill == oracle_skill(task.data, "specific")
    with pytest.raises(ConfigError, match="skills.chat_model: cannot import 'bench.nowhere'"):
        build_analyzer(TrainConfig(skills={**skills, "chat_model": "bench.nowhere:X"}), policy=None)
    with pytest.raises(ConfigError, match="skills.chat_model: "):
        build_analyzer(TrainConfig(skills={**skills, "chat_model_kwargs": {"style": 7}}), policy=None)
    for bad, says in (({"source": "self"}, "needs skills.source external"),
                      ({"analyzer": {"kind": "local"}}, "keep one"),
                      ({"chat_model": None}, "chat_model_kwargs without")):
        with pytest.raises(ValidationError, match=says):
            TrainConfig(skills={**skills, **bad})
