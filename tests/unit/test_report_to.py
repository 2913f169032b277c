"""``trainer.report_to``: the SEED metrics reach TRL's integrations; TensorBoard tested for real."""

import json
from pathlib import Path
from typing import get_args

import pytest

pytest.importorskip("trl")

from seed_agents.app.policy import check_report_to
from seed_agents.app.train import run_train  # noqa: E402
from seed_agents.config import ConfigError, ReportTo, TrainConfig  # noqa: E402

CALC_TASKS = Path(__file__).resolve().parents[2] / "configs" / "data" / "calculator_train.jsonl"
SEED_METRICS = ("loss/ppo", "loss/opd", "opd/gate", "success_rate", "skill_parse_rate", "reward")


def tiny_config(tmp_path: Path, model: str, report_to: list[str]) -> TrainConfig:
    return TrainConfig.model_validate({
        "num_tasks": 2, "tasks_per_iteration": 1, "iterations": 2, "out": str(tmp_path / "run"),
        "graph": {"build": "seed_agents.graphs.calculator:build_react_calculator", "tasks": str(CALC_TASKS),
                  "reward": "seed_agents.graphs.calculator:calculator_reward", "input": "messages"},
        "backend": {"kind": "local", "model": model},
        "sampling": {"max_tokens": 8, "temperature": 1.0},
        "runner": {"group_size": 2, "progress": False},
        "skills": {"source": "self", "max_tokens": 16},
        "trainer": {"learning_rate": 1e-3, "kl_coef": 0.0, "report_to": report_to},
    })


def test_report_to_names_are_the_ones_transformers_knows():
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    assert set(get_args(ReportTo)) <= set(INTEGRATION_TO_CALLBACK)
    assert {"tensorboard", "wandb", "mlflow", "trackio"} <= set(get_args(ReportTo))
    with pytest.raises(ValueError, match="report_to"):
        TrainConfig.model_validate({"trainer": {"report_to": ["tensorbord"]}})


def test_an_integration_that_is_not_installed_is_one_clear_error(monkeypatch):
    monkeypatch.setattr("transformers.integrations.get_available_reporting_integrations", lambda: ["tensorboard"])
    check_report_to(["tensorboard"])
    with pytest.raises(ConfigError, match="trainer.report_to: wandb is not installed"):
        check_report_to(["tensorboard", "wandb"])


def test_tensorboard_event_file_holds_the_seed_metrics(tmp_path, tiny_model_dir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_train(tiny_config(tmp_path, tiny_model_dir, ["tensorboard"]))
    out = tmp_path / "run"
    events = sorted((out / "checkpoints" / "runs").glob("*/events.out.tfevents.*"))
    assert len(events) == 1, events
    scalars = EventAccumulator(str(events[0].parent)).Reload()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for name in SEED_METRICS:
        points = scalars.Scalars(f"train/{name}")
        # one point per update, equal (as float32) to the row metrics.jsonl holds for it
        assert [p.step for p in points] == [1, 2], name
        assert [p.value for p in points] == pytest.approx([row[name] for row in rows], rel=1e-6, abs=1e-7), name

