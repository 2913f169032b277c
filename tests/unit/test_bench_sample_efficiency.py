"""The sample-efficiency benchmark's own arithmetic: a wrong threshold or ratio would make
its printed claim wrong while every training run is fine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_sample_efficiency", ROOT / "bench" / "sample_efficiency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def curve(*points: tuple[int, float]) -> list[dict]:
    return [{"episodes_consumed": e, "success_rate": s} for e, s in points]


def test_episodes_to_threshold_is_the_first_evaluation_reaching_it_in_episode_order(bench):
    c = curve((16, 0.6), (0, 0.0), (8, 0.5), (24, 0.2))
    assert bench.episodes_to_threshold(c, 0.5) == 8
    assert bench.episodes_to_threshold(c, 0.7) is None  # never reached is not "the budget"


def test_a_seed_that_never_reaches_the_threshold_leaves_the_mean_undefined(bench):
    s = bench.summarize_method({0: curve((0, 0.0), (8, 0.5)), 1: curve((0, 0.25), (8, 0.25))}, 0.5)
    assert s["reached"] == "1/2" and s["to_threshold"] == {0: 8, 1: None}
    assert s["mean_to_threshold"] is None
    assert s["area"][0] == pytest.approx((0.25 + 0.25) / 2)
    assert s["start"][0] == pytest.approx(0.125) and s["final"][0] == pytest.approx(0.375)
    assert s["gain"][0] == pytest.approx(0.25)
    assert [p["mean"] for p in s["curve"]] == pytest.approx([0.125, 0.375])


def test_report_prints_ratios_only_where_both_methods_have_them(bench):
    grpo = bench.summarize_method({0: curve((0, 0.0), (8, 0.5))}, 0.5)
    seed = bench.summarize_method({0: curve((0, 0.5), (8, 1.0))}, 0.5)
    text = bench.report({"grpo": grpo, "seed": seed}, 0.5)
    assert "SEED/GRPO: 0.00" in text  # seed reached it at 0 episodes, grpo at 8
    assert "mean held-out success, SEED/GRPO: 3.00" in text
    never = bench.summarize_method({0: curve((0, 0.0), (8, 0.25))}, 0.5)
    assert "n/a" in bench.report({"grpo": never, "seed": seed}, 0.5)


def test_drop_checkpoints_keeps_the_results(bench, tmp_path):
    (tmp_path / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "checkpoints" / "checkpoint-1" / "optimizer.pt").write_bytes(b"x" * 10)
    (tmp_path / "eval.jsonl").write_text("{}\n")
    bench.drop_checkpoints(tmp_path)
    bench.drop_checkpoints(tmp_path)  # nothing left to drop is fine
    assert not (tmp_path / "checkpoints").exists()
    assert (tmp_path / "eval.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("method", ["grpo", "seed", "grpo_stage1", "seed_no_stage1", "seed_frozen", "seed_rule"])
def test_every_method_is_a_valid_train_config_differing_only_where_it_should(bench, method, tmp_path):
    from seed_agents.config import TrainConfig

    args = bench.build_parser().parse_args(["--out", str(tmp_path)])
    cfg = TrainConfig.model_validate(bench.train_config(method, 0, args, "/stage1/model"))
    base = TrainConfig.model_validate(bench.train_config("grpo", 0, args, "/stage1/model"))
    same = ("env", "split", "num_tasks", "tasks_per_iteration", "iterations", "seed", "sampling", "runner", "agent", "eval")
    assert all(getattr(cfg, k) == getattr(base, k) for k in same)  # one budget for every method
    assert cfg.trainer.learning_rate == base.trainer.learning_rate
    starts_from_stage1 = method in bench.STAGE1_START and method != "seed"  # seed finds it through stage1.run auto
    assert cfg.backend.model == ("/stage1/model" if starts_from_stage1 else args.model)
    assert (cfg.trainer.opd_coef > 0) == method.startswith("seed")
    expected_source = {"grpo": "none", "grpo_stage1": "none", "seed_frozen": "frozen", "seed_rule": "rule_based"}
    assert cfg.skills.source == expected_source.get(method, "self")


def test_paired_differences_are_taken_seed_by_seed(bench):
    base = bench.summarize_method({0: curve((0, 0.0), (8, 0.5)), 1: curve((0, 0.5), (8, 0.5)),
                                   2: curve((0, 0.25), (8, 0.25))}, 0.5)
    seed = bench.summarize_method({0: curve((0, 0.5), (8, 0.5)), 1: curve((0, 0.0), (8, 0.5)),
                                   2: curve((0, 0.25), (8, 0.25)), 3: curve((0, 1.0), (8, 1.0))}, 0.5)
    line = bench.paired_line("seed", seed, "grpo_stage1", base)
    # per seed: +0.25, -0.25, 0 (seed 3 has no partner)
    assert "+0.000 ± 0.250 over 3 seeds (1 higher, 1 lower, 1 equal)" in line
    assert "paired by seed" in bench.report({"grpo_stage1": base, "seed": seed}, 0.5)


def test_behaviour_table_reads_invalid_rates_and_training_metrics(bench, tmp_path):
    rows = [{"episodes_consumed": 0, "success_rate": 0.0, "invalid_action_rate": 0.8},
            {"episodes_consumed": 8, "success_rate": 0.5, "invalid_action_rate": 0.2}]
    s = bench.summarize_method({0: rows}, 0.5)
    assert s["invalid_start"][0] == pytest.approx(0.8) and s["invalid_final"][0] == pytest.approx(0.2)
    (tmp_path / "metrics.jsonl").write_text(
        '{"skill_parse_rate": 1.0, "opd/gate": 0.4, "opd/tokens": 10}\n{"skill_parse_rate": 0.5, "opd/gate": 0.6, "opd/tokens": 5}\n')
    s["train"] = bench.training_stats([str(tmp_path)])
    assert s["train"] == {"skill_parse_rate": pytest.approx(0.75), "gate": pytest.approx(0.5)}
    text = bench.report({"seed": s}, 0.5)
    assert "0.800 ± 0.000 -> 0.200 ± 0.000" in text and "0.750" in text and "0.500" in text


def test_the_header_names_every_setting_that_differs_from_the_paper(bench):
    """The CPU defaults depart from the paper in model, KL, lr, budget, group and tasks per
    update: each is in the table's header, with the paper's value beside it."""
    head = bench.header(bench.build_parser().parse_args([]))
    assert head.splitlines()[1] == (
        "differs from the paper: model smollm2-135m (paper Qwen2.5-3B-Instruct); KL coef 0 (paper 0.01); "
        "lr 2e-05 (paper 1e-06); updates 4 (paper 150); tasks/update 2 (paper 16); group size 4 (paper 8); "
        "max turns 3 (paper 30)")
    # one change, one departure: --opd-coef is compared too
    assert bench.departures(bench.build_parser().parse_args(["--opd-coef", "0.1"]))[2] == "OPD lambda 0.1 (paper 0.01)"


def test_the_papers_protocol_has_no_departure(bench):
    args = bench.build_parser().parse_args(["--full", "--model", "Qwen/Qwen2.5-3B-Instruct", "--kl-coef", "0.01"])
    assert bench.departures(args) == []
    assert bench.header(args).endswith("every compared setting is the paper's")
    # --full alone keeps the CPU default KL of 0: the header says so
    assert bench.departures(bench.build_parser().parse_args(["--full", "--model", "Qwen/Qwen2.5-3B-Instruct"])) == [
        "KL coef 0 (paper 0.01)"]
