"""bench/engine_iteration.py: the sides' configs and the ratio it reports."""

from __future__ import annotations

from bench.engine_iteration import USER_LEAVES_ALONE, ratios, workload_config
from seed_agents.config import TrainConfig
from seed_agents.config.presets import MAIN_JOB


def test_the_main_workload_is_the_main_job_without_evaluation_on_the_named_engine():
    cfg = workload_config("main", "vllm", 3)
    assert "eval" not in cfg and cfg["iterations"] == 3 and cfg["backend"]["kind"] == "vllm"
    assert cfg["graph"] == MAIN_JOB["graph"] and cfg["runner"]["concurrency"] == MAIN_JOB["runner"]["concurrency"]
    assert "eval" in MAIN_JOB, "the preset itself is not changed"
    TrainConfig.model_validate(cfg)


def test_the_user_workload_leaves_scheduling_at_the_defaults():
    cfg = workload_config("user", "local", 2)
    for section, key in USER_LEAVES_ALONE:
        assert key not in cfg.get(section, {})
    default = TrainConfig()
    parsed = TrainConfig.model_validate(cfg)
    assert parsed.runner.concurrency == default.runner.concurrency
    assert parsed.backend.max_batch_size == default.backend.max_batch_size


def _side(times: list[float], phase: float) -> dict:
    return {"iteration_s_mean_after_first": sum(times[1:]) / len(times[1:]),
            "iterations": [{"iteration_s": t, "rollout_s": phase, "score_s": 1.0, "update_s": 2.0, "sync_s": 0.5}
                           for t in times]}


def test_the_ratio_is_local_over_vllm_after_the_first_iteration():
    got = ratios({"main/local": _side([100.0, 60.0, 60.0], 40.0), "main/vllm": _side([300.0, 30.0, 30.0], 10.0)})
    assert got["main"]["local_over_vllm"] == 2.0
    assert got["main"]["phases"]["rollout_s"] == {"local": 40.0, "vllm": 10.0}
    assert "user" not in got
