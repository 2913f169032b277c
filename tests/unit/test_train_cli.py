"""`seed-agents train` end to end on a tiny model: any graph, traces, resume, bad config."""

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from seed_agents.app.cli import main  # noqa: E402
from seed_agents.app.train import run_train  # noqa: E402
from seed_agents.config import ConfigError, TrainConfig  # noqa: E402
from seed_agents.memory import PEAK_RSS  # noqa: E402

CALC_TASKS = Path(__file__).resolve().parents[2] / "configs" / "data" / "calculator_train.jsonl"


# What these tests were written under: full weights, TRL's schedule, the paper's OPD weight, no
# guided openings (the ReAct calculator's first turn is free) and skills on every episode. The
# defaults moved to what the learning runs chose; a test that wants one of them names it.
WRITTEN_UNDER = {"lora_r": None, "lr_schedule": "linear", "opd_coef": 0.01, "guide_share": 0.0}


def calc_config(tmp_path, tiny_model_dir, **over):
    raw = {
        "num_tasks": 4, "tasks_per_iteration": 1, "iterations": 1, "out": str(tmp_path / "run"),
        "graph": {"build": "seed_agents.graphs.calculator:build_react_calculator", "tasks": str(CALC_TASKS),
                  "reward": "seed_agents.graphs.calculator:calculator_reward", "input": "messages"},
        "backend": {"kind": "local", "model": tiny_model_dir},
        "sampling": {"max_tokens": 8, "temperature": 1.0},
        "runner": {"group_size": 2, "progress": False},
        "skills": {"source": "self", "max_tokens": 16, "answer_format": "described", "failures": "write"},
        "trainer": {"learning_rate": 1e-3},
        **over,
    }
    raw["trainer"] = {**WRITTEN_UNDER, **raw["trainer"]}
    return TrainConfig.model_validate(raw)


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def sampled(trajs):
    """What each call sampled, token for token (ids and the time of the call differ run to run)."""
    return [[(c["prompt_ids"], c["completion_ids"], c["logprobs"]) for c in t["calls"]] for t in trajs]


def test_train_any_graph_writes_every_trace_and_resumes_without_duplicates(tmp_path, tiny_model_dir):
    cfg = calc_config(tmp_path, tiny_model_dir)
    summary = run_train(cfg)
    out = tmp_path / "run"
    assert summary["iterations"] == 1 and summary["policy_version"] == 1
    metrics = lines(out / "metrics.jsonl")
    assert [m["iteration"] for m in metrics] == [0]
    for key in ("success_rate", "reward", "loss/ppo", "skill_parse_rate", "policy_version", "time/rollout_s", "time/score_s", "time/sync_s"):
        assert key in metrics[0], key
    # the step's time covers its rollouts and scoring (and the loss, backward, optimizer step)
    assert metrics[0]["time/step_s"] > metrics[0]["time/rollout_s"] + metrics[0]["time/score_s"]
    if PEAK_RSS.reset():  # each phase's peak RSS (Linux), none above the process's
        phases = [metrics[0][f"mem/{phase}_peak_gb"] for phase in ("rollout", "score", "update")]
        assert all(0.1 < p <= metrics[0]["mem/process_peak_gb"] for p in phases), metrics[0]
        assert summary["peak_rss_gb"] >= metrics[0]["mem/process_peak_gb"]
    assert len(lines(out / "trajectories.jsonl")) == 2 and len(lines(out / "skills.jsonl")) == 2
    # the hindsight node asked with the configured reply example
    asked = [m["content"] for t in lines(out / "trajectories.jsonl") for c in t["calls"] if c["purpose"] == "analyzer"
             for m in c["messages"] if m["role"] == "user"]
    assert len(asked) == 2 and all("<the rule to follow next time>" in text for text in asked)
    assert (out / "learning_curve.png").stat().st_size > 0 and (out / "checkpoints" / "checkpoint-1").is_dir()
    assert not list(out.rglob("events.out.tfevents.*"))  # trainer.report_to is empty by default

    # an interrupted second iteration left a partial trace: resume drops it and re-runs it
    with (out / "trajectories.jsonl").open("a") as f:
        f.write(json.dumps({"metadata": {"iteration": 1}, "task_id": "partial"}) + "\n")
    summary = run_train(cfg.model_copy(update={"iterations": 2}), resume=True)
    assert summary["iterations"] == 2 and summary["policy_version"] == 2
    assert [m["iteration"] for m in lines(out / "metrics.jsonl")] == [0, 1]
    trajs = lines(out / "trajectories.jsonl")
    assert [t["metadata"]["iteration"] for t in trajs] == [0, 0, 1, 1]
    versions = {t["metadata"]["iteration"]: {c["policy_version"] for c in t["calls"] if c["purpose"] == "policy"} for t in trajs}
    assert versions == {0: {0}, 1: {1}}  # iteration k was sampled by the weights after k updates


def test_train_passes_the_skill_opening_and_the_failure_rule_to_the_hindsight_node(tmp_path, tiny_model_dir):
    skills = {"source": "self", "max_tokens": 64, "opening": "call", "failures": "write"}
    run_train(calc_config(tmp_path, tiny_model_dir, skills=skills))
    trajs = lines(tmp_path / "run" / "trajectories.jsonl")
    tags = [c["sampling"]["structural_tag"] for t in trajs for c in t["calls"] if c["purpose"] == "analyzer"]
    assert len(tags) == 2 and all('"Call (' in tag for tag in tags)  # the grammar opens with the graph's tools
    run_train(calc_config(tmp_path, tiny_model_dir, out=str(tmp_path / "skip"), skills={**skills, "failures": "skip"}))
    trajs = lines(tmp_path / "skip" / "trajectories.jsonl")
    asked = sum(c["purpose"] == "analyzer" for t in trajs for c in t["calls"])
    assert asked == sum(t["success"] for t in trajs)
    assert all(s["reject_reason"] == "not written: skills.failures skip"
               for s in lines(tmp_path / "skip" / "skills.jsonl") if not s["success"])


def test_existing_run_needs_resume_and_resume_needs_a_run(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}\n")  # a run killed before its first trace
    with pytest.raises(ConfigError, match="--resume"):
        run_train(calc_config(tmp_path, tiny_model_dir))
    with pytest.raises(ConfigError, match="no run under"):
        run_train(calc_config(tmp_path, tiny_model_dir, out=str(tmp_path / "empty")), resume=True)


def test_bad_train_configs_get_one_clear_error(tmp_path, capsys, tiny_model_dir):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("iterations: 2\ntrainer:\n  learning_rat: 0.1\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "trainer.learning_rat" in capsys.readouterr().err
    cfg.write_text("runner:\n  group_size: 1\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "group_size must be >= 2" in capsys.readouterr().err
    bad = calc_config(tmp_path, tiny_model_dir).model_dump(mode="json")
    bad["graph"]["build"] = "seed_agents.graphs.calculator:nope"
    cfg.write_text(json.dumps(bad))
    assert main(["train", "--config", str(cfg)]) == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err


def test_the_main_job_equals_its_config_file_and_the_textworld_demo_is_one_config_away():
    """`seed-agents train` with no config runs exactly configs/atlas_agent.yaml (the shipped tool
    agent, free to choose its tools, with a held-out evaluation); naming a task source (a
    config with env, graph or store, or the flag) leaves the main job out, so the TextWorld
    demo file gives TrainConfig's own defaults."""
    from seed_agents.app.cli import _parser, build_train_config
    from seed_agents.config import load_config

    configs = Path(__file__).resolve().parents[2] / "configs"
    main_job = build_train_config(_parser().parse_args(["train"]))
    assert main_job.model_dump() == load_config(TrainConfig, configs / "atlas_agent.yaml", {}).model_dump()
    assert main_job.graph is not None and main_job.graph.build == "seed_agents.tools.atlas:build_free_agent"
    assert main_job.eval is not None and main_job.eval.num_tasks >= 100 and main_job.eval.at_start
    assert main_job.skills.source == "self" and main_job.trainer.guide_share == "auto"  # SEED, guided where free
    demo = build_train_config(_parser().parse_args(["train", "--config", str(configs / "textworld_smollm2_cpu.yaml")]))
    assert demo.model_dump() == TrainConfig().model_dump() and demo.graph is None and demo.eval is None
    assert build_train_config(_parser().parse_args(["train", "--env", "textworld"])).graph is None
    tweaked = build_train_config(_parser().parse_args(["train", "--iterations", "2", "--preset", "paper"]))
    assert tweaked.graph == main_job.graph and tweaked.iterations == 2 and tweaked.trainer.learning_rate == 1e-6


def test_periodic_held_out_eval_rows_and_resume(tmp_path, tiny_model_dir):
    eval_cfg = {"tasks": str(CALC_TASKS), "num_tasks": 2, "every": 2, "at_start": True}
    cfg = calc_config(tmp_path, tiny_model_dir, iterations=3, eval=eval_cfg)
    run_train(cfg)
    out = tmp_path / "run"
    rows = lines(out / "eval.jsonl")
    # before training, every 2 updates, and after the last update
    assert [r["updates"] for r in rows] == [0, 2, 3]
    if PEAK_RSS.reset():
        assert all(r["mem/eval_peak_gb"] > 0.1 for r in rows)
    assert [r["episodes_consumed"] for r in rows] == [0, 4, 6]  # 1 task x group 2 per update
    evals = lines(out / "eval_trajectories.jsonl")
    # each row's rates are its own episodes' (from the trace); an 8-token random model
    # never answers a calculator task, so every success rate is exactly 0
    for r in rows:
        mine = [t for t in evals if t["metadata"]["iteration"] == r["updates"] - 1]
        assert r["episodes"] == len(mine) == 2
        assert r["success_rate"] == sum(t["success"] for t in mine) / 2 == 0.0
        assert r["mean_reward"] == sum(t["reward"] for t in mine) / 2
    assert len(evals) == 6 and {c["scope"]["eval_after_updates"] for t in evals for c in t["calls"]} == {0, 2, 3}
    # the training traces never hold eval episodes
    assert all("eval_after_updates" not in c["scope"] for t in lines(out / "trajectories.jsonl") for c in t["calls"])

    # resuming from checkpoint-2 re-runs update 3: its eval row is dropped, then written again
    import shutil
    shutil.rmtree(out / "checkpoints" / "checkpoint-3")
    run_train(cfg, resume=True)
    assert [r["updates"] for r in lines(out / "eval.jsonl")] == [0, 2, 3]


def test_eval_split_must_be_held_out():
    with pytest.raises(ValueError, match="held-out"):
        TrainConfig.model_validate({"split": "train", "eval": {"split": "train"}})
    with pytest.raises(ValueError, match="eval.tasks"):
        TrainConfig.model_validate({"graph": {"build": "a:b", "tasks": "t.jsonl", "reward": "a:c"}, "eval": {}})


def test_resume_before_the_first_checkpoint_keeps_a_finished_initial_eval(tmp_path, tiny_model_dir):
    """A run killed after its initial evaluation but before checkpoint 1 restarts at step 0:
    the initial policy's held-out rows are kept once, not evaluated again beside the kept
    ones; a half-written initial evaluation (trajectories without their row) is redone."""
    import shutil

    eval_cfg = {"tasks": str(CALC_TASKS), "num_tasks": 2, "every": 2, "at_start": True}
    cfg = calc_config(tmp_path, tiny_model_dir, iterations=2, eval=eval_cfg)
    run_train(cfg)
    out = tmp_path / "run"
    full = {name: lines(out / name) for name in ("eval.jsonl", "eval_trajectories.jsonl", "trajectories.jsonl")}
    shutil.rmtree(out / "checkpoints")
    run_train(cfg, resume=True)
    assert [r["updates"] for r in lines(out / "eval.jsonl")] == [0, 2]
    assert [t["metadata"]["iteration"] for t in lines(out / "eval_trajectories.jsonl")] == [-1, -1, 1, 1]
    # the training episodes are those of the uninterrupted run: skipping the evaluation moves no RNG
    assert sampled(lines(out / "trajectories.jsonl")) == sampled(full["trajectories.jsonl"])

    # killed between the initial trajectories and their row: the trajectories are dropped and the evaluation redone
    shutil.rmtree(out / "checkpoints")
    (out / "eval.jsonl").write_text("")
    run_train(cfg, resume=True)
    assert [r["updates"] for r in lines(out / "eval.jsonl")] == [0, 2]
    evals = lines(out / "eval_trajectories.jsonl")
    assert [t["metadata"]["iteration"] for t in evals] == [-1, -1, 1, 1]
    assert sampled(evals) == sampled(full["eval_trajectories.jsonl"])

    # a row whose trajectories fall short of what it counts: both dropped and redone
    shutil.rmtree(out / "checkpoints")
    (out / "eval_trajectories.jsonl").write_text(json.dumps(evals[0]) + "\n")
    run_train(cfg, resume=True)
    assert [r["updates"] for r in lines(out / "eval.jsonl")] == [0, 2]
    assert sampled(lines(out / "eval_trajectories.jsonl")) == sampled(full["eval_trajectories.jsonl"])


def test_the_initial_evaluation_is_the_same_for_every_seed_and_method(tmp_path, tiny_model_dir):
    """What bench/learning_curve.py's reuse of the initial evaluation rests on: a LoRA adapter
    starts as the identity and a greedy evaluation draws no random number, so runs of other
    seeds, skills and training settings play the held-out tasks token for token alike."""
    eval_cfg = {"tasks": str(CALC_TASKS), "num_tasks": 2, "every": 1, "at_start": True, "temperature": 0.0}
    initial = []
    for i, over in enumerate([{"seed": 0, "skills": {"source": "none"}, "trainer": {"learning_rate": 1e-3, "lora_r": 4}},
                              {"seed": 1, "trainer": {"learning_rate": 3e-3, "lora_r": 8, "opd_coef": 0.1}}]):
        cfg = calc_config(tmp_path, tiny_model_dir, eval=eval_cfg, out=str(tmp_path / f"run{i}"), **over)
        run_train(cfg)
        evals = lines(tmp_path / f"run{i}" / "eval_trajectories.jsonl")
        initial.append(sampled([t for t in evals if t["metadata"]["iteration"] == -1]))
        after = sampled([t for t in evals if t["metadata"]["iteration"] == 0])
        assert after != initial[-1]  # one update at these rates moves the greedy choice: the comparison can tell runs apart
    assert initial[0] == initial[1] and len(initial[0]) == 2

    # the second run again, started with the first one's initial evaluation copied (as the bench does):
    # `--resume` keeps it and the run is the one it would have been
    copy = tmp_path / "run2"
    copy.mkdir()
    for name in ("eval.jsonl", "eval_trajectories.jsonl"):
        kept = [x for x in (tmp_path / "run0" / name).read_text().splitlines()
                if json.loads(x).get("iteration", json.loads(x).get("metadata", {}).get("iteration")) == -1]
        (copy / name).write_text("".join(x + "\n" for x in kept))
    run_train(cfg.model_copy(update={"out": str(copy)}), resume=True)
    for name in ("eval_trajectories.jsonl", "trajectories.jsonl"):
        assert sampled(lines(copy / name)) == sampled(lines(tmp_path / "run1" / name)), name
    assert [r["updates"] for r in lines(copy / "eval.jsonl")] == [0, 1]


def test_a_step_gives_freed_memory_back_between_its_phases_and_changes_no_value(tmp_path, tiny_model_dir, monkeypatch):
    """Three releases a step (after the rollouts, the scoring and the update) and a fourth
    after a held-out evaluation where one ran, none with trainer.release_memory false (the
    path before); the two runs sample the same tokens with the same log-probs and log the
    same losses."""
    import seed_agents.app.train as train_mod
    import seed_agents.trainers.seed_trainer as trainer_mod
    from seed_agents.memory import release_free_memory

    where: list[str] = []
    for mod, name in ((trainer_mod, "trainer"), (train_mod, "callback")):
        monkeypatch.setattr(mod, "release_free_memory", lambda name=name: where.append(name) or release_free_memory())
    runs = {}
    for release in (True, False):
        where.clear()
        out = tmp_path / f"release-{release}"
        run_train(calc_config(tmp_path, tiny_model_dir, iterations=2, out=str(out),
                              trainer={"learning_rate": 1e-3, "release_memory": release}))
        assert where == (["trainer", "trainer", "callback"] * 2 if release else [])
        runs[release] = (sampled(lines(out / "trajectories.jsonl")),
                         [(m["loss/ppo"], m["loss/total"], m["grad_norm"]) for m in lines(out / "metrics.jsonl")])
    assert runs[True] == runs[False] and len(runs[True][1]) == 2
    # a held-out evaluation after the second update only: its heap is given back too, once
    where.clear()
    eval_cfg = {"tasks": str(CALC_TASKS), "num_tasks": 1, "every": 2, "at_start": False, "temperature": 0.0}
    run_train(calc_config(tmp_path, tiny_model_dir, iterations=2, out=str(tmp_path / "release-eval"), eval=eval_cfg,
                          trainer={"learning_rate": 1e-3, "release_memory": True}))
    assert where == ["trainer", "trainer", "callback"] + ["trainer", "trainer", "callback", "callback"]


def test_a_resume_whose_formats_resolve_otherwise_says_so_and_names_the_flags(tmp_path, capsys):
    """`auto` depends on the CPU: a run started in bf16 and resumed where auto means fp32
    carries on in fp32; the resume says so, with the flags that keep the start's formats."""
    from seed_agents.app.policy import compute_format
    from seed_agents.app.train import FORMAT_FILE, check_format

    bf16 = {"update": "bfloat16", "rollouts": "bfloat16", "attention": "float32"}
    fp32 = {"update": "float32", "rollouts": "float32", "attention": "float32"}
    check_format(tmp_path, bf16, resume=False)
    check_format(tmp_path, bf16, resume=True)
    assert capsys.readouterr().out == ""
    check_format(tmp_path, fp32, resume=True)
    note = capsys.readouterr().out
    assert note.startswith("note: ") and "--backend.precision bfloat16 --backend.attention float32" in note
    assert json.loads((tmp_path / FORMAT_FILE).read_text()) == bf16  # the start's record is kept
    # what a config resolves to: explicit formats resolve alike on every machine
    explicit = compute_format(TrainConfig.model_validate({"backend": {"precision": "float32"}}).backend)
    assert explicit == fp32
    served = TrainConfig.model_validate({"backend": {"kind": "vllm", "model": "m"}}).backend
    assert compute_format(served) == {"update": "float32"}  # a vLLM server samples in fp32 (seed-agents serve)


def test_auto_keeps_a_local_backend_on_a_gpu_in_fp32_where_its_cpu_autocast_would_not_reach(monkeypatch):
    """The local backend's autocast is the CPU's: with the model on a CUDA device it would
    sample in fp32 while the trainer updated in bf16 (TRL's autocast there), so `auto` keeps
    both in fp32; an explicit format is taken as given."""
    import torch

    from seed_agents.app.policy import compute_format

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    local = TrainConfig().backend
    assert compute_format(local) == {"update": "float32", "rollouts": "float32", "attention": "float32"}
    explicit = TrainConfig.model_validate({"backend": {"precision": "bfloat16", "attention": "same"}}).backend
    assert compute_format(explicit)["update"] == "bfloat16"
