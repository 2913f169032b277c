"""Wrapped tool agents train: LangChain v1's ``create_agent`` and a hand-written
``StateGraph`` tool loop, each one iteration of ``seed-agents train`` on a tiny model with
its calls captured into training rows. The legacy prebuilt is trained by
``test_train_cli.py``'s own config."""

import json
import warnings

import pytest

pytest.importorskip("trl")

from seed_agents.app.train import run_train
from seed_agents.graphs.calculator import build_react_calculator
from seed_agents.rows import trajectory_to_rows
from seed_agents.types import Trajectory
from tests.unit.test_train_cli import calc_config


def test_the_calculator_agent_uses_the_current_api_without_deprecation_warnings(tiny_model_dir):
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    class _Fake(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        agent = build_react_calculator(_Fake(messages=iter([])))
    assert type(agent).__module__.startswith("langgraph") and "model" in agent.nodes  # create_agent's node names


@pytest.mark.parametrize("build", ["build_react_calculator", "build_graph_calculator"])
def test_wrapped_tool_agent_trains_one_iteration_on_captured_rows(tmp_path, tiny_model_dir, build):
    cfg = calc_config(tmp_path, tiny_model_dir, graph={
        "build": f"seed_agents.graphs.calculator:{build}", "tasks": str(calc_config(tmp_path, tiny_model_dir).graph.tasks),
        "reward": "seed_agents.graphs.calculator:calculator_reward", "input": "messages"})
    summary = run_train(cfg)
    assert summary["iterations"] == 1 and summary["policy_version"] == 1  # one optimizer step happened
    out = tmp_path / "run"
    trajs = [Trajectory.model_validate(json.loads(x)) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 2 and all(t.fault is None for t in trajs)
    for t in trajs:
        calls = t.policy_calls
        assert calls and all(c.completion_ids and len(c.logprobs) == len(c.completion_ids) for c in calls)
        # the agent offered its tools through our chat model, and the calls were constrained
        assert all({f["function"]["name"] for f in c.tools or []} == {"add", "multiply"} for c in calls)
        assert all(c.sampling.structural_tag is not None for c in calls)
        rows = trajectory_to_rows(t)
        assert sum(r.num_sampled_tokens for r in rows) == sum(len(c.completion_ids) for c in calls)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["rows"] >= 2
