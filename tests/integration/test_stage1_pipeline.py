"""collect -> SFT -> train, end to end on real TextWorld games, the way `seed-agents
train` runs it by default: a SEED run with no stage-1 model builds one (offline analyzer,
SFT), caches it, starts from it, and a second run reuses the cache."""

import json

import pytest

pytest.importorskip("trl")
pytest.importorskip("textworld")

from seed_agents.app.train import run_train  # noqa: E402
from seed_agents.config import TrainConfig  # noqa: E402
from seed_agents.stage1.auto import cache_key  # noqa: E402

pytestmark = pytest.mark.integration


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def tiny_run(tmp_path, model: str, out: str, skills: dict, **stage1) -> TrainConfig:
    """One update of 1 task x 2 episodes, 2 turns, on real TextWorld games."""
    return TrainConfig.model_validate({
        "env": "textworld", "num_tasks": 2, "tasks_per_iteration": 1, "iterations": 1, "out": str(tmp_path / out),
        "env_options": {"cache_dir": str(tmp_path / "tw")},
        "backend": {"kind": "local", "model": model},
        "sampling": {"max_tokens": 6, "temperature": 1.0},
        "runner": {"group_size": 2, "progress": False},
        "agent": {"max_turns": 2, "history": "chat"},
        "skills": skills,
        "stage1": {"cache_dir": str(tmp_path / "stage1"), **stage1},
        "trainer": {"learning_rate": 1e-4},
    })


def test_train_builds_the_stage1_model_first_then_reuses_it(tmp_path, tiny_model_dir, capsys):
    cfg = tiny_run(tmp_path, tiny_model_dir, "run1", {"source": "self", "max_tokens": 16},
                   num_tasks=2, group_size=2, epochs=1)
    summary = run_train(cfg)
    root = tmp_path / "stage1" / cache_key(cfg, tiny_model_dir)
    model_dir = root / "sft" / "model"
    assert (root / "DONE").exists() and (model_dir / "config.json").exists()
    assert summary["initial_weights"] == str(model_dir) and summary["iterations"] == 1

    # stage 1: every collected episode was analyzed by the offline analyzer, and its JSON parses
    examples = lines(root / "collect" / "examples.jsonl")
    assert len(examples) == 4 and all(e["valid"] and e["analyzer"] == "rule-based-textworld" for e in examples)
    sft = json.loads((root / "sft" / "sft_summary.json").read_text())
    assert sft["split"]["n_train"] + sft["split"]["n_heldout"] == 4

    # the RL run played with the hindsight node on, from the stage-1 weights
    trajs = lines(tmp_path / "run1" / "trajectories.jsonl")
    assert len(trajs) == 2 and all(t["skill"] is not None for t in trajs)

    # a second run with the same stage-1 settings reuses the cached model
    capsys.readouterr()
    run_train(cfg.model_copy(update={"out": tmp_path / "run2"}))
    assert "using the cached stage-1 model" in capsys.readouterr().out


def test_rule_based_skills_train_without_stage1_and_reach_the_teacher(tmp_path, tiny_model_dir):
    """The ablation that separates the distillation term from the policy's own skill
    writing: the offline analyzer writes every skill, the policy is never asked."""
    summary = run_train(tiny_run(tmp_path, tiny_model_dir, "run", {"source": "rule_based"}))
    assert summary["initial_weights"] == tiny_model_dir and not (tmp_path / "stage1").exists()  # no stage 1
    trajs = lines(tmp_path / "run" / "trajectories.jsonl")
    assert len(trajs) == 2 and all(t["skill"]["valid"] and t["skill"]["call_id"] is None for t in trajs)
    assert not any(c["purpose"] == "analyzer" for t in trajs for c in t["calls"])
    [m] = [r for r in lines(tmp_path / "run" / "metrics.jsonl") if "skill_parse_rate" in r]
    assert m["skill_parse_rate"] == 1.0 and m["opd/tokens"] > 0  # the teacher scored every action token


def test_rule_based_skills_need_an_env_suite():
    """rule_based is the env suite's offline analyzer: ALFWorld offers one too; a graph has none."""
    TrainConfig.model_validate({"env": "alfworld", "skills": {"source": "rule_based"}})
    with pytest.raises(ValueError, match="offline analyzer, and a graph has no env suite"):
        TrainConfig.model_validate({"skills": {"source": "rule_based"},
                                    "graph": {"build": "m:f", "tasks": "t.jsonl", "reward": "m:r"}})
