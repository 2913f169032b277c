"""Guided openings (``trainer.guide_share``): a share of training episodes has its first free
tool choice steered into a call, and the steering prefill is trained as if chosen.

Covered here, tier by tier: the scope hands out one guide per episode; the chat model
steers only a free policy call and records the prefill it added; rows train the prefill
from the prompt the model was offered; the trainer scores the prefill's old log-probs with
the pre-update policy (and nothing else); the runner spreads the share evenly; configs
refuse it where episodes are not played here.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel, forced_tool_prefix
from seed_agents.rows import calls_to_rows, guided_prefill
from seed_agents.runner import EpisodeRunner, RunnerConfig, guided_episode
from seed_agents.testing import FakeBackend
from seed_agents.types import LLMCall, Row, Trajectory


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


CALL_REST = 'lookup", "arguments": {"key": "x"}}\n</tool_call>'


def _llm(tokenizer, replies=CALL_REST, purpose="policy"):
    backend = FakeBackend(tokenizer, replies)
    return SeedChatModel(backend=backend, tokenizer=tokenizer, purpose=purpose, max_tokens=64), backend


# -- the scope ---------------------------------------------------------------------------

def test_a_guided_scope_gives_its_guide_once_also_to_nested_scopes():
    with capture(guide=True) as episode:
        with capture(purpose="analyzer") as inner:
            assert inner.take_guide()
            assert not inner.take_guide() and not episode.take_guide()
    with capture() as plain:
        assert not plain.take_guide()


def test_a_first_call_guide_is_given_up_by_the_first_policy_call_free_or_not():
    with capture(guide="first_call") as episode:
        assert not episode.take_guide(free=False) and not episode.guide  # a forced first turn: no guide after it
        assert not episode.take_guide()
    with capture(guide="first_call") as episode:
        assert episode.take_guide() and not episode.take_guide()
    with capture(guide=True) as episode:  # an explicit share waits for the first free choice
        assert not episode.take_guide(free=False) and episode.take_guide()


# -- the chat model ----------------------------------------------------------------------

def test_the_first_free_policy_call_is_steered_and_records_its_prefill(tokenizer):
    llm, backend = _llm(tokenizer)
    bound = llm.bind_tools([lookup, add])
    question = [HumanMessage("Look up x.")]
    free_ids, _ = llm.render(question, bound.kwargs["tools"])
    with capture(guide=True) as scope:
        first = bound.invoke(question)
        second = bound.invoke(question)
    guided, free = scope.calls
    assert guided.guided and not free.guided and free.prefill_len == 0
    # the prompt sent is the free prompt plus the "any" prefill, which the record counts
    prefill = forced_tool_prefix("any", bound.kwargs["tools"])
    assert tokenizer.decode(guided.prompt_ids[-guided.prefill_len:]) == prefill
    assert guided.prompt_ids[:-guided.prefill_len] == free_ids == free.prompt_ids == backend.prompts[1]
    assert backend.prompts[0] == guided.prompt_ids
    assert guided.messages[-1] == {"role": "assistant", "content": prefill}
    assert first.tool_calls and first.tool_calls[0]["name"] == "lookup" and first.tool_calls[0]["args"] == {"key": "x"}
    assert not second.tool_calls  # the free call's reply continued no prefill: it does not parse as a call


def test_forced_choices_analyzers_and_toolless_calls_leave_the_guide(tokenizer):
    llm, _ = _llm(tokenizer)
    q = [HumanMessage("Look up x.")]
    with capture(guide=True) as scope:
        llm.bind_tools([lookup], tool_choice="lookup").invoke(q)  # forced by the graph already
        llm.invoke(q)  # no tools: nothing to steer
        with capture(purpose="analyzer"):
            llm.bind_tools([lookup]).invoke(q)
        assert scope.guide, "none of those calls took the guide"
        llm.bind_tools([lookup]).invoke(q)
    assert [c.guided for c in scope.calls] == [False, False, False, True]


def test_a_guided_call_on_a_real_model_samples_a_call_that_parses(tiny_model_dir, tokenizer):
    """The local backend under the tool grammar: the random model completes the steered
    opening into a call to a bound tool, and its recorded logprobs cover only what it sampled."""
    from seed_agents.backends.local import LocalBackend

    llm = SeedChatModel(backend=LocalBackend(tiny_model_dir), tokenizer=tokenizer, temperature=1.0, max_tokens=80)
    with capture(guide=True, seed=0) as scope:
        reply = llm.bind_tools([lookup, add]).invoke([HumanMessage("Add 2 and 3.")])
    (call,) = scope.calls
    assert call.guided and call.prefill_len > 0 and len(call.logprobs) == len(call.completion_ids)
    assert reply.tool_calls and reply.tool_calls[0]["name"] in {"lookup", "add"}, call.text


# -- rows --------------------------------------------------------------------------------

def _traj(calls):
    return Trajectory(task_id="t", group_id="g", calls=calls)


def test_a_guided_row_starts_at_the_offered_prompt_and_trains_the_prefill():
    call = LLMCall(messages=[], prompt_ids=[1, 2, 3, 7, 8], completion_ids=[9, 10], logprobs=[-0.2, -0.3],
                   guided=True, prefill_len=2)
    (row,) = calls_to_rows([call], _traj([call]))
    assert row.prompt_ids == [1, 2, 3] and row.completion_ids == [7, 8, 9, 10]
    assert row.loss_mask == [1, 1, 1, 1] and row.guide_mask == [1, 1, 0, 0]
    assert row.old_logprobs == [0.0, 0.0, -0.2, -0.3]
    assert guided_prefill(call) == 2


def test_a_guided_call_merges_after_a_free_one_and_keeps_its_guide_mask():
    a = LLMCall(messages=[], prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1])
    # the next prompt extends a's prompt + completion by an observation (4) and the prefill (7, 8)
    b = LLMCall(messages=[], prompt_ids=[1, 2, 3, 4, 7, 8], completion_ids=[9], logprobs=[-0.4], guided=True,
                prefill_len=2)
    (row,) = calls_to_rows([a, b], _traj([a, b]))
    assert row.completion_ids == [3, 4, 7, 8, 9]
    assert row.loss_mask == [1, 0, 1, 1, 1] and row.guide_mask == [0, 0, 1, 1, 0]
    assert row.old_logprobs == [-0.1, 0.0, 0.0, 0.0, -0.4]
    # and a free call after a guided row extends the mask with zeros
    c = LLMCall(messages=[], prompt_ids=row.prompt_ids + row.completion_ids + [5], completion_ids=[6], logprobs=[-0.5])
    (row2,) = calls_to_rows([a, b, c], _traj([a, b, c]))
    assert row2.guide_mask == [0, 0, 1, 1, 0, 0, 0] and row2.loss_mask == [1, 0, 1, 1, 1, 0, 1]


def test_unguided_rows_carry_no_guide_mask_and_records_are_checked():
    call = LLMCall(messages=[], prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1])
    (row,) = calls_to_rows([call], _traj([call]))
    assert row.guide_mask == [] and row.prompt_ids == [1, 2]
    with pytest.raises(ValueError, match="only on guided"):
        LLMCall(messages=[], prompt_ids=[1, 2], completion_ids=[], logprobs=[], prefill_len=1)
    with pytest.raises(ValueError, match="leaves no prompt"):
        LLMCall(messages=[], prompt_ids=[1, 2], completion_ids=[], logprobs=[], guided=True, prefill_len=2)
    with pytest.raises(ValueError, match="must be trained"):
        Row(prompt_ids=[1], completion_ids=[2], loss_mask=[0], old_logprobs=[0.0], guide_mask=[1],
            trajectory_id="x", task_id="t", group_id="g", call_ids=["c"])


# -- the runner --------------------------------------------------------------------------

@pytest.mark.parametrize(("share", "guided"), [(0.0, []), (0.25, [3, 7]), (0.5, [1, 3, 5, 7]), (1.0, list(range(8)))])
def test_the_share_is_spread_evenly_over_each_group(share, guided):
    assert [i for i in range(8) if guided_episode(i, share)] == guided


def test_the_runner_guides_its_share_of_each_group(tokenizer):
    from langgraph.graph import END, START, MessagesState, StateGraph

    llm, _ = _llm(tokenizer)
    bound = llm.bind_tools([lookup, add])  # two tools: the "any" prefill leaves the name to the reply

    def agent(state):
        return {"messages": [bound.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    runner = EpisodeRunner(g.compile(), RunnerConfig(group_size=4, progress=False), guide_share=0.5,
                           make_input=lambda t: {"messages": [HumanMessage("Look up x.")]},
                           reward_fn=lambda task, state: float(bool(state["messages"][-1].tool_calls)))
    from seed_agents.types import Task

    trajs = asyncio.run(runner.run([Task(task_id="a"), Task(task_id="b")]))
    assert [t.calls[0].guided for t in trajs] == [False, True, False, True] * 2
    # only the steered episodes' replies parse as calls (the fake continues the prefill)
    assert [t.reward for t in trajs] == [0.0, 1.0, 0.0, 1.0] * 2
    from seed_agents.trainers.rollout import guided_metrics

    assert guided_metrics(trajs) == {"guided_episodes": 4.0, "guided_success_rate": 1.0, "free_success_rate": 0.0}
    with pytest.raises(ValueError, match="not in"):
        EpisodeRunner(g.compile(), RunnerConfig(), guide_share=1.5)


def _one_agent_graph(llm, first_choice=None, tools=(lookup, add)):
    """An agent of two policy calls: the first with ``first_choice`` (None: free), the second free."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    first = llm.bind_tools(list(tools), tool_choice=first_choice) if tools else llm
    free = llm.bind_tools([lookup, add])

    def agent(state):
        return {"messages": [first.invoke(state["messages"]), free.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    return g.compile()


@pytest.mark.parametrize(("first_choice", "tools", "guided"), [
    (None, (lookup, add), [[False, False], [True, False]] * 2),  # free first turn with tools: half guided
    ("any", (lookup, add), [[False, False]] * 4),  # forced first turn: its free second turn is not steered
    (None, (), [[False, False]] * 4),  # no tools on the first turn: nothing to steer
])
def test_auto_guides_half_of_each_group_only_where_the_first_turn_is_free_with_tools(tokenizer, first_choice, tools,
                                                                                     guided):
    from seed_agents.types import Task

    llm, _ = _llm(tokenizer)
    runner = EpisodeRunner(_one_agent_graph(llm, first_choice, tools), RunnerConfig(group_size=4, progress=False),
                           guide_share="auto", make_input=lambda t: {"messages": [HumanMessage("Look up x.")]})
    trajs = asyncio.run(runner.run([Task(task_id="a")]))
    assert [[c.guided for c in t.calls] for t in trajs] == guided
    # an explicit share steers the first free choice wherever it comes: the forced agent's second turn
    explicit = EpisodeRunner(_one_agent_graph(llm, "any"), RunnerConfig(group_size=2, progress=False), guide_share=0.5,
                             make_input=lambda t: {"messages": [HumanMessage("Look up x.")]})
    trajs = asyncio.run(explicit.run([Task(task_id="a")]))
    assert [[c.guided for c in t.calls] for t in trajs] == [[False, False], [False, True]]


# -- the trainer -------------------------------------------------------------------------

def test_the_trainer_scores_guide_tokens_with_the_pre_update_policy(tiny_model_dir, tokenizer, tmp_path):
    """Old log-probs of guide tokens are the policy's own (recomputed); every other token
    keeps what the sampler recorded. The teacher prompt leaves the prefill out."""
    datasets = pytest.importorskip("datasets")
    from transformers import AutoModelForCausalLM

    from seed_agents.trainers.rollout import GraphRollout
    from seed_agents.trainers.seed_trainer import RolloutBatch, SEEDConfig, SEEDTrainer
    from seed_agents.types import Skill, Task

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    llm, _ = _llm(tokenizer)
    bound = llm.bind_tools([lookup])
    q = [HumanMessage("Look up x.")]
    trajs = []
    for i in range(2):
        with capture(guide=(i == 1)) as scope:
            bound.invoke(q)
        t = Trajectory(task_id="t", group_id="g", sample_index=i, calls=list(scope.calls), reward=float(i),
                       success=bool(i))
        t.skill = Skill(success=bool(i), skill="Call lookup first.", valid=True)
        trajs.append(t)
    rollout = GraphRollout(runner=None, llm=llm, skills="self", merge_rows=False)  # type: ignore[arg-type]
    batch: RolloutBatch = rollout.build(trajs)
    free_row, guided_row = batch.rows
    assert not free_row.guide_mask and sum(guided_row.guide_mask) == trajs[1].calls[0].prefill_len
    assert guided_row.prompt_ids == free_row.prompt_ids  # both start where the model was free
    # the teacher prompt is the free prompt with the skill: it does not end in the prefill
    assert batch.teacher_prompt_ids[1] == batch.teacher_prompt_ids[0]
    assert "Call lookup first." in tokenizer.decode(batch.teacher_prompt_ids[1])

    ds = datasets.Dataset.from_list([{"prompt": Task(task_id="t").model_dump_json()}])
    args = SEEDConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2, use_cpu=True,
                      bf16=False, report_to=[], save_strategy="no", seed=0, max_steps=1)
    trainer = SEEDTrainer(model=model, args=args, train_dataset=ds, rollout=rollout, processing_class=tokenizer)
    out = trainer.score_batch(batch)
    old = out["old_per_token_logps"]
    n = len(guided_row.completion_ids)
    with torch.no_grad():
        ids = torch.tensor([guided_row.prompt_ids + guided_row.completion_ids])
        logits = model(ids).logits[0, len(guided_row.prompt_ids) - 1:-1].float()
        own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(guided_row.completion_ids)[:, None]).squeeze(-1)
    guide = torch.tensor(guided_row.guide_mask, dtype=torch.bool)
    assert torch.allclose(old[1, :n][guide], own[guide], atol=1e-4)
    assert old[1, :n][~guide].tolist() == pytest.approx(guided_row.old_logprobs[sum(guided_row.guide_mask):])
    assert old[0, :len(free_row.completion_ids)].tolist() == pytest.approx(free_row.old_logprobs)
    assert out["guide_mask"][1, :n].tolist() == guided_row.guide_mask


class _MergingTemplate:
    """A renderer whose ids are characters, standing in for a tokenizer that merges the
    offered prompt's last id with the prefill's first (SmolLM2's does not)."""

    def native_tools(self) -> bool:
        return True

    def render(self, messages, tools):
        text = "".join(f"{m.type}:{m.content}|" for m in messages) + "assistant:"
        return [ord(c) for c in text], None


def test_a_teacher_prompt_loses_the_ids_a_tokenizer_merged_into_the_prefill():
    """The row's prompt is the offered render minus the merged id; the teacher prompt,
    skill and all, must end at the same id, or every teacher position after the skill is
    shifted by the merge."""
    from seed_agents.trainers.rollout import GraphRollout
    from seed_agents.types import Skill

    llm = _MergingTemplate()
    messages = [{"role": "user", "content": "Look up x."}]
    offered, _ = llm.render([HumanMessage("Look up x.")], None)
    prompt = offered[:-1] + [999, 5, 6]  # ":" of "assistant:" merged with the prefill's start
    call = LLMCall(messages=[*messages, {"role": "assistant", "content": "<tool_call>"}], prompt_ids=prompt,
                   completion_ids=[7, 8], logprobs=[-0.1, -0.2], guided=True, prefill_len=3)
    traj = Trajectory(task_id="t", group_id="g", calls=[call], reward=1.0, success=True,
                      skill=Skill(success=True, skill="Call lookup first.", valid=True))
    pair = [traj, traj.model_copy(update={"sample_index": 1, "reward": 0.0})]  # a lone episode is not trained
    batch = GraphRollout(runner=None, llm=llm, skills="self", merge_rows=False).build(pair)  # type: ignore[arg-type]
    row, teacher = batch.rows[0], batch.teacher_prompt_ids[0]
    assert row.prompt_ids == offered[:-1] and row.completion_ids[:3] == [999, 5, 6]
    assert "Call lookup first." in "".join(map(chr, teacher))
    assert "".join(map(chr, teacher)).endswith("human:Look up x.|assistant")  # the merged ":" is the row's
    # unmerged, the teacher prompt keeps the whole offered render
    plain = call.model_copy(update={"prompt_ids": offered + [5, 6], "prefill_len": 2})
    batch = GraphRollout(runner=None, llm=llm, skills="self", merge_rows=False).build(  # type: ignore[arg-type]
        [t.model_copy(update={"calls": [plain]}) for t in pair])
    assert "".join(map(chr, batch.teacher_prompt_ids[0])).endswith("human:Look up x.|assistant:")


# -- configs -----------------------------------------------------------------------------

def test_configs_refuse_a_guide_share_where_no_episode_is_played_here(tmp_path):
    from pydantic import ValidationError

    from seed_agents.app.continual_config import ContinualConfig
    from seed_agents.config import TrainerConfig
    from seed_agents.config.commands import TrainConfig

    with pytest.raises(ValidationError, match="guide_share"):
        TrainConfig(store={"url": "sqlite:///x.db"}, skills={"source": "none"}, trainer={"guide_share": 0.5})
    with pytest.raises(ValidationError):
        TrainerConfig(guide_share=1.5)
    assert TrainConfig(trainer={"guide_share": 0.5}).trainer.guide_share == 0.5
    assert TrainerConfig(guide_share="auto").guide_share == "auto" and TrainerConfig(guide_share="0.5").guide_share == 0.5
    # auto where nothing is played here guides none, and says so in the config the run records
    stored = TrainConfig(store={"url": "sqlite:///x.db"}, skills={"source": "none"}, trainer={"guide_share": "auto"})
    assert stored.trainer.guide_share == 0.0
    (tmp_path / "canary.jsonl").write_text("")
    continual = {
        "store": f"sqlite:///{tmp_path}/t.db", "backend": {"kind": "vllm", "model": "m", "base_url": "http://127.0.0.1:9"},
        "agent": {"tools": {"base_url": "http://127.0.0.1:9", "allow_hosts": ["127.0.0.1"]},
                  "reward": "tests.unit.test_continual_checks:episode_reward"},
        "canary": {"tasks": str(tmp_path / "canary.jsonl")}}
    assert ContinualConfig.model_validate({**continual, "trainer": {"lora_r": 4}}).trainer.guide_share == 0.0
    with pytest.raises(ValidationError, match="guide_share"):
        ContinualConfig.model_validate({**continual, "trainer": {"lora_r": 4, "guide_share": 0.5}})
    auto = ContinualConfig.model_validate({**continual, "trainer": {"lora_r": 4, "guide_share": "auto"}})
    assert auto.trainer.guide_share == 0.0


def test_an_agent_continuing_its_own_assistant_turn_is_not_steered(tokenizer):
    """A trailing assistant message is the agent's own prefill: its choice is made, and a
    second, steering prefill after it would render two assistant turns."""
    llm, _ = _llm(tokenizer)
    with capture(guide=True) as scope:
        llm.bind_tools([lookup]).invoke([HumanMessage("x"), AIMessage("I will")])
        assert scope.guide
        llm.bind_tools([lookup]).invoke([HumanMessage("x")])
    assert [c.guided for c in scope.calls] == [False, True]


def test_a_training_step_with_guided_episodes_runs_through_trl(tiny_model_dir, tokenizer, tmp_path):
    """The whole path: the runner guides half of each group, rows carry guide masks, TRL's
    loop splits the batch (guide_mask included) and steps; the metrics split guided and free."""
    datasets = pytest.importorskip("datasets")
    from langgraph.graph import END, START, MessagesState, StateGraph
    from transformers import AutoModelForCausalLM

    from seed_agents.trainers.rollout import GraphRollout
    from seed_agents.trainers.seed_trainer import SEEDConfig, SEEDTrainer
    from seed_agents.types import Task

    llm, _ = _llm(tokenizer)
    bound = llm.bind_tools([lookup, add])
    g = StateGraph(MessagesState)
    g.add_node("agent", lambda state: {"messages": [bound.invoke(state["messages"])]})
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    runner = EpisodeRunner(g.compile(), RunnerConfig(progress=False, concurrency=4), guide_share=0.5,
                           make_input=lambda t: {"messages": [HumanMessage("Look up x.")]},
                           reward_fn=lambda task, state: float(bool(state["messages"][-1].tool_calls)))
    rollout = GraphRollout(runner, llm, skills="none", merge_rows=False, out_dir=tmp_path / "run")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ds = datasets.Dataset.from_list([{"prompt": Task(task_id="t").model_dump_json()}])
    args = SEEDConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, use_cpu=True,
                      bf16=False, report_to=[], logging_steps=1, save_strategy="no", seed=0, max_steps=1,
                      learning_rate=1e-2, opd_coef=0.0)
    trainer = SEEDTrainer(model=model, args=args, train_dataset=ds, rollout=rollout, processing_class=tokenizer)
    trainer.train()
    logs = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    assert logs["guided_episodes"] == 2.0 and logs["guided_success_rate"] == 1.0 and logs["free_success_rate"] == 0.0
    assert logs["zero_variance_groups"] == 0.0  # the guided episodes gave the group its variance
    assert logs["guide/logp"] < 0 and logs["guide/first_logp"] < 0  # the opening's pre-update log-probs
    assert sum(sum(r.guide_mask) > 0 for r in trainer.last_batch.rows) == 2
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
