"""The sample-efficiency benchmark's own arithmetic: a wrong threshold or ratio would make
its printed claim wrong while every training run is fine."""

from __future__ import annotations

import importlib.util
import json
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
    assert "95% bootstrap CI [-0.250, +0.250]" in line and "no effect to detect" in line
    assert "paired by seed" in bench.report({"grpo_stage1": base, "seed": seed}, 0.5)


def test_each_seed_variant_is_compared_with_grpo_from_its_own_start(bench):
    s = {m: bench.summarize_method({0: curve((0, 0.0), (8, 0.25 * k)), 1: curve((0, 0.0), (8, 0.25 * k + 0.125)),
                                    2: curve((0, 0.0), (8, 0.25 * k))}, 0.5)
         for k, m in enumerate(["grpo", "grpo_stage1", "seed", "seed_no_stage1"])}
    assert set(bench.paired(s)) == {"seed - grpo_stage1", "seed_no_stage1 - grpo"}
    p = bench.paired(s)["seed_no_stage1 - grpo"]  # +0.375 on every seed: no spread, the minimum 2 seeds
    assert (p.n, p.mean, p.ci, p.seeds_needed) == (3, pytest.approx(0.375), pytest.approx((0.375, 0.375)), 2)
    text = bench.report(s, 0.5)
    assert "seed_no_stage1 - grpo: +0.375" in text and "seed - grpo_stage1: +0.125" in text
    assert "seed - grpo:" not in text and "to detect it (paired t, alpha 0.05, power 0.8): 2 seeds" in text


def test_raw_results_keep_every_evaluation_point_of_every_seed(bench, tmp_path):
    from bench.results import load_result, write_result

    runs = []
    for m, rates in (("grpo_stage1", (0.0, 0.25)), ("seed", (0.0, 0.5))):
        for seed in (0, 1):
            out = tmp_path / f"{m}-s{seed}"
            out.mkdir()
            out.joinpath("eval.jsonl").write_text("".join(
                json.dumps({"episodes_consumed": 8 * i, "success_rate": r + seed / 12, "invalid_action_rate": 0.5})
                + "\n" for i, r in enumerate(rates)))
            runs.append({"method": m, "seed": seed, "out": str(out), "rc": 0, "wall_s": 12.5})
    runs.append({"method": "seed", "seed": 2, "out": str(tmp_path / "missing"), "rc": 1, "wall_s": 3.0})
    summary = {m: bench.summarize_method({r["seed"]: bench.read_curve(r["out"]) for r in runs
                                          if r["method"] == m and r["rc"] == 0}, 0.5) for m in ("grpo_stage1", "seed")}
    args = bench.build_parser().parse_args(["--out", str(tmp_path), "--seeds", "0", "1", "2"])
    raw = bench.raw_results(["grpo_stage1", "seed"], runs, summary, 60.0)
    path = write_result("sample_efficiency", bench.run_config(args), raw, paper=bench.PAPER,
                        labels=bench.PAPER_LABELS, results_dir=tmp_path / "results")
    r = load_result(path)
    assert [p["success_rate"] for p in r.results["curves"]["seed"]["1"]] == pytest.approx([1 / 12, 0.5 + 1 / 12])
    assert set(r.results["curves"]["seed"]) == {"0", "1"}  # the failed run has no curve, and says so in runs
    assert r.results["runs"][-1] == {"method": "seed", "seed": 2, "rc": 1, "wall_s": 3.0, "reused": None}
    assert r.results["paired"]["seed - grpo_stage1"]["mean"] == pytest.approx(0.125)
    assert r.departures() == bench.departures(args)  # the header a table prints comes from the stored config
    assert str(tmp_path) not in path.read_text()  # no machine paths in a committed file
    # the README's table renders from exactly these keys, the departures in its header
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "scripts" / "readme_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    text = tables.render("<!-- results:sample_efficiency -->\n<!-- /results:sample_efficiency -->", {r.name: r})
    assert "KL coef 0 (paper 0.01)" in text and "seeds 0, 1, 2" in text
    assert "| `seed` | 0.042 ± 0.059 | 0.292 ± 0.059 | 0.542 ± 0.059 | +0.500 ± 0.000 | 2/2 (at 8, 8 episodes) |" in text
    assert "`seed - grpo_stage1`: +0.125 ± 0.000 over 2 seeds (2 higher, 0 lower, 0 equal); 95% bootstrap CI [+0.125, +0.125]" in text


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
