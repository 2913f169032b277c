"""`seed-agents eval` end to end: real TextWorld games, a real model, both backends."""

import json

import pytest

from seed_agents.app.cli import main
from seed_agents.capture import read_jsonl
from seed_agents.rows import trajectory_to_rows
from seed_agents.types import LLMCall, Trajectory

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tw_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tw-cache")


def eval_run(tmp_path, tw_cache, *argv):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"env_options:\n  cache_dir: {tw_cache}\n")
    out = tmp_path / "run"
    code = main(["eval", "--config", str(cfg), "--out", str(out), "--episodes", "2", "--group", "2",
                 "--max-turns", "2", "--max-tokens", "8", *argv])
    assert code == 0
    return out


def check_run(out, expect_version=0):
    summary = json.loads((out / "summary.json").read_text())
    trajs = read_jsonl(out / "trajectories.jsonl", Trajectory)
    calls = read_jsonl(out / "calls.jsonl", LLMCall)
    assert summary["episodes"] == len(trajs) == 2 and summary["errors"] == 0
    assert len({t.group_id for t in trajs}) == 1 and {t.sample_index for t in trajs} == {0, 1}
    traj_calls = [c for t in trajs for c in t.calls]
    assert sorted(c.call_id for c in traj_calls) == sorted(c.call_id for c in calls)
    assert summary["llm_calls"] == len(calls) == sum(t.steps for t in trajs)
    for c in calls:
        assert c.prompt_ids and 1 <= len(c.completion_ids) <= 8 and len(c.logprobs) == len(c.completion_ids)
        assert c.policy_version == expect_version and c.scope["task_id"].startswith("tw-")
    assert sum(len(trajectory_to_rows(t)) for t in trajs) == summary["rows"]
    for key in ("success_rate", "mean_reward", "mean_steps", "tokens_per_s"):
        assert key in summary
    return trajs


def test_eval_with_local_backend(tmp_path, tw_cache, tiny_model_dir, capsys):
    out = eval_run(tmp_path, tw_cache, "--model", tiny_model_dir)
    check_run(out)
    assert "success_rate" in capsys.readouterr().out


def test_eval_with_vllm_server(tmp_path, tw_cache, vllm_server, tiny_model_dir):
    out = eval_run(tmp_path, tw_cache, "--backend", "vllm", "--base-url", vllm_server.url,
                   "--model", vllm_server.served_model_name, "--tokenizer", tiny_model_dir)
    check_run(out)

