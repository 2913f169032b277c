"""bench/demo_speed.py: the two sides' settings, and what it computes from their runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import demo_speed  # noqa: E402
from seed_agents.config import TrainConfig  # noqa: E402


def test_the_before_side_switches_off_every_reuse_and_the_others_keep_the_demo():
    from seed_agents.backends.engine import ENGINE_ENV, LocalEngineOptions

    cfg = {side: TrainConfig.model_validate(demo_speed.demo_config(over)) for side, over in demo_speed.SIDES.items()}
    before = cfg["before"]
    assert before.backend.precision == "float32"
    assert (before.trainer.chunk_tokens, before.trainer.share_prefix, before.trainer.sampled_head) == (0, False, False)
    assert before.trainer.keep_activations_gb == 0 == TrainConfig().trainer.keep_activations_gb
    # the local backend's older paths are engine options, given to the side's children as their environment
    engine = {side: LocalEngineOptions.model_validate_json(demo_speed.engine_env(side)[ENGINE_ENV]) for side in demo_speed.SIDES}
    assert engine["before"] == LocalEngineOptions(reuse_kv=False, kv_cache="concat", prefix_groups=False, drop_finished=False)
    assert engine["previous"] == LocalEngineOptions(drop_finished=False)
    assert all(engine[side] == LocalEngineOptions() for side in demo_speed.SIDES if side not in ("before", "previous"))
    demo = TrainConfig()
    assert before.stage1.completion_head is False and demo.stage1.completion_head is True
    assert cfg["default"] == demo  # the README's first command
    assert (demo.backend.precision, demo.backend.attention) == ("auto", "auto")
    assert cfg["fp32"] == demo.model_copy(update={"backend": demo.backend.model_copy(update={"precision": "float32"})})
    plain = demo.backend.model_copy(update={"precision": "auto", "attention": "same"})
    assert cfg["auto"] == demo.model_copy(update={"backend": plain})
    fast = demo.backend.model_copy(update={"precision": "auto", "attention": "float32"})
    assert cfg["auto-attn32"] == demo.model_copy(update={"backend": fast})
    assert demo.trainer.sampled_head is True
    assert cfg["previous"] == demo
    assert cfg["keep"] == demo.model_copy(update={"trainer": demo.trainer.model_copy(update={"keep_activations_gb": "auto"})})
    # nothing else differs from the embedded demo
    assert before.model_copy(update={"backend": demo.backend, "trainer": demo.trainer, "stage1": demo.stage1}) == demo


def test_iterations_start_from_one_model_and_the_ratios_read_against_the_goals(tmp_path, monkeypatch, capsys):
    calls = []
    stage1_s = {"before": 100.0, "previous": 40.0, "fp32": 80.0, "default": 38.0, "auto": 40.0, "auto-attn32": 38.0}
    iteration_s = {"before": 200.0, "previous": 76.0, "fp32": 120.0, "default": 70.0, "auto": 90.0, "auto-attn32": 70.0}

    def build_stage1(side, work, log):
        calls.append(("stage1", side))
        return {"collect_s": stage1_s[side] / 2, "sft_s": stage1_s[side] / 2, "stage1_s": stage1_s[side], "process_s": 1.0,
                "model": f"/{side}-model", "parse_rate_after": 1.0, "episodes": 16}

    def iterate(side, work, model, repeat, log, iterations=1):
        calls.append(("iter", side, model, repeat))
        s = iteration_s[side]
        return {"time/step_s": s, "time/sync_s": 0.0, "time/rollout_s": s / 2, "time/score_s": 1.0, "iteration_s": s,
                "process_s": s + 5}

    monkeypatch.setattr(demo_speed, "build_stage1", build_stage1)
    monkeypatch.setattr(demo_speed, "iterate", iterate)
    monkeypatch.setattr(demo_speed, "prepare_games", lambda: calls.append(("games",)))
    demo_speed.main(["--repeats", "2", "--results-dir", str(tmp_path / "results"), "--work", str(tmp_path / "w")])
    sides = ["before", "previous", "fp32", "default", "auto", "auto-attn32"]
    assert calls[:7] == [("games",), *(("stage1", side) for side in sides)]
    assert [c[1] for c in calls[7:]] == [*sides, *sides[::-1]]
    assert {c[2] for c in calls[7:]} == {"/before-model"}
    doc = json.loads((tmp_path / "results" / "demo_speed.json").read_text())
    r = doc["results"]
    assert r["iteration_ratio"] == pytest.approx({"previous": 0.38, "fp32": 0.6, "default": 0.35, "auto": 0.45, "auto-attn32": 0.35})
    assert r["iteration_verdict"] == {"previous": "met", "fp32": "missed by 0.20", "default": "met", "auto": "missed by 0.05",
                                      "auto-attn32": "met"}
    assert r["stage1_ratio"] == pytest.approx({"previous": 0.4, "fp32": 0.8, "default": 0.38, "auto": 0.4, "auto-attn32": 0.38})
    assert r["stage1_verdict"]["auto"] == "met"
    assert "model" not in r["stage1"]["before"]  # a folder of this machine stays out of the file
    assert doc["config"]["side_settings"] == {side: demo_speed.SIDES[side] for side in sides}  # the sides it ran
    assert "ratio 0.45 (goal <= 0.4: missed by 0.05)" in capsys.readouterr().out

    # the table the docs show, generated from that file
    sys.path.insert(0, str(ROOT / "scripts"))
    import readme_tables

    from bench.results import load_result

    page = "<!-- results:demo_speed -->\n<!-- /results:demo_speed -->\n"
    out = readme_tables.render(page, {"demo_speed": load_result(tmp_path / "results" / "demo_speed.json")})
    fp32 = "fp32 (`--backend.precision float32`, the README's command before auto)"
    assert f"| {fp32} | 80 s (40 + 40) | 0.80 | 120 s | 60 s | 0.60 |" in out
    assert "| default (the README's command when run) | 38 s (19 + 19) | 0.38 | 70 s | 35 s | 0.35 |" in out
    assert "`auto` iteration 0.45x (goal <= 0.4: missed by 0.05), stage 1 0.40x (goal <= 0.5: met)" in out


def test_without_stage1_the_iterations_start_from_the_given_model_and_say_so(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(demo_speed, "build_stage1", lambda *a: pytest.fail("stage 1 built under --no-stage1"))
    monkeypatch.setattr(demo_speed, "prepare_games", lambda: None)

    def iterate(side, work, model, repeat, log, iterations=1):
        seen.append((side, model))
        s = {"before": 100.0, "auto-attn32": 38.0}[side]
        return {"time/step_s": s, "time/sync_s": 0.0, "time/rollout_s": s / 2, "time/score_s": 1.0, "iteration_s": s,
                "process_s": s + 5}

    monkeypatch.setattr(demo_speed, "iterate", iterate)
    demo_speed.main(["--no-stage1", "--model", "/given", "--sides", "before,auto-attn32", "--result-name",
                     "demo_speed_x", "--results-dir", str(tmp_path), "--work", str(tmp_path / "w")])
    assert seen == [("before", "/given"), ("auto-attn32", "/given")]
    sys.path.insert(0, str(ROOT / "scripts"))
    import readme_tables

    from bench.results import load_result

    doc = load_result(tmp_path / "demo_speed_x.json")
    assert "stage1" not in doc.results and "model" not in doc.config
    page = "<!-- results:demo_speed_x -->\n<!-- /results:demo_speed_x -->\n"
    out = readme_tables.render(page, {"demo_speed_x": doc})
    assert "stage 1 not timed (--no-stage1)" in out and "stage 1 built" not in out
    assert "| `--backend.precision auto --backend.attention float32` | - | - | 38 s | 19 s | 0.38 |" in out


@pytest.mark.parametrize(("argv", "message"), [(["--no-stage1"], "--no-stage1 needs --model"),
                                               (["--sides", "before"], "at least two different sides"),
                                               (["--sides", "before,fast"], "unknown side 'fast'")])
def test_bad_arguments_get_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        demo_speed.main(argv)
    assert message in capsys.readouterr().err


def test_a_run_of_several_iterations_reads_the_median_of_its_iterations(tmp_path, monkeypatch):
    """The README's command runs three iterations; the first pays one-off costs, so a run's
    iteration time is the median of its own, each kept."""
    def run(cmd, log, env=None):
        assert env == {"SEED_AGENTS_BENCH_LOCAL_ENGINE": "{}"}  # the default side's children run the defaults
        cfg = json.loads(Path(cmd[-1]).read_text())
        assert cfg["iterations"] == 3 and cfg["stage1"]["run"] == "off"
        rows = [{"time/step_s": s, "time/sync_s": 0.5, "time/rollout_s": s / 2, "time/score_s": 1.0}
                for s in (50.0, 40.0, 41.0)]
        Path(cfg["out"]).mkdir(parents=True)
        (Path(cfg["out"]) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 99.0

    monkeypatch.setattr(demo_speed, "run", run)
    it = demo_speed.iterate("default", tmp_path, "/model", 0, tmp_path / "log", iterations=3)
    assert it["each_iteration_s"] == [50.5, 40.5, 41.5]
    assert it["iteration_s"] == 41.5 and it["time/rollout_s"] == 20.5 and it["process_s"] == 99.0
