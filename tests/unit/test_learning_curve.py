"""bench/learning_curve.py: its statistics, its verdict and its resume, without training."""

import hashlib
import json

import numpy as np
import pytest

from bench.learning_curve import analyse, hierarchical_ci, run_one, train_config


def _args(**over):
    """bench/learning_curve.py's parsed flags, as the tests below need them (``over`` changes some)."""
    import argparse

    return argparse.Namespace(**{
        "tasks_per_update": 4, "updates": 30, "group": 8, "first_turn": "forced", "model": "smollm2-135m",
        "max_tokens": 64, "temperature": 0.7, "skill_tokens": 64, "lr": 1e-4, "lora_r": 8, "kl_coef": 0.001,
        "eval_every": 5, "guide_share": 0.0, "lr_schedule": "linear", "precision": "float32", "kv_cache": "dynamic",
        "attention": "same", "opd_coef": None, "injector": "system", "fuse_teacher": False, "answer_format": "paper",
        "skill_opening": "words", "skill_failures": "write", **over})


def _run(start: list[bool], end: list[bool], zero_var: float = 0.5) -> dict:
    def levels(ok: bool) -> dict:
        return {"parsed": True, "right_calls": ok, "right_answer": ok, "fault": False}

    return {"scores": {0: {f"h{i}": levels(x) for i, x in enumerate(start)},
                       10: {f"h{i}": levels(x) for i, x in enumerate(end)}},
            "metrics": [{"update": u, "success_rate": 0.3, "zero_variance_groups": zero_var} for u in range(1, 11)]}


def _fake_training(trained: list[str], stop_at: str | None = None):
    """``run_one`` without training, and the held-out scores it leaves (none right before, all
    after 2 updates): each run it is asked for is appended to ``trained``; ``stop_at`` names a
    run during which the session ends (KeyboardInterrupt) the first time it trains."""
    scores = {0: {f"atlas-heldout-L0-00{i}": {"parsed": True, "right_calls": False, "right_answer": False, "fault": False}
                  for i in range(3)}}
    scores[2] = {t: {**v, "right_calls": True, "right_answer": True} for t, v in scores[0].items()}

    def fake_run_one(config, out, log, revision=1):
        if (out / "benchmark-done.json").exists():  # as run_one: a finished run is not run again
            return 7.0
        trained.append(out.name)
        if out.name == stop_at and trained.count(stop_at) == 1:
            raise KeyboardInterrupt
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "success_rate": 0.25,
                                                                "zero_variance_groups": 0.5}) + "\n" for i in range(2)))
        (out / "benchmark-done.json").write_text(json.dumps({"config": "fake", "wall_s": 7.0}))
        return 7.0

    return fake_run_one, scores


def test_hierarchical_ci_does_not_depend_on_the_order_runs_and_tasks_were_read_in():
    # a run read from its folder lists tasks as its episodes finished, one read from a result
    # file in the stored order: the same scores must give the same interval
    rng = np.random.default_rng(3)
    per_seed = {s: {f"t{i}": float(rng.random() < 0.5) for i in range(20)} for s in range(3)}
    shuffled = {s: dict(reversed(list(per_seed[s].items()))) for s in reversed(list(per_seed))}
    assert hierarchical_ci(per_seed, resamples=500) == hierarchical_ci(shuffled, resamples=500)


def test_hierarchical_ci_brackets_the_mean_and_is_none_without_spread_to_resample():
    assert hierarchical_ci({}) is None
    assert hierarchical_ci({0: {"a": 1.0}}) is None
    assert hierarchical_ci({0: {"a": 0.5, "b": 0.5}, 1: {"a": 0.5}}, resamples=200) == (0.5, 0.5)
    low, high = hierarchical_ci({0: {"a": 0.0, "b": 1.0}, 1: {"a": 1.0, "b": 1.0}}, resamples=2000)
    assert 0.0 <= low < 0.75 < high <= 1.0


def test_a_clear_gain_meets_the_goal_and_no_gain_misses_it():
    n = 40
    gain = {s: _run([False] * n, [i % 2 == 0 for i in range(n)]) for s in range(3)}  # 0 -> 50% on every seed
    flat = {s: _run([i % 4 == 0 for i in range(n)], [i % 4 == 0 for i in range(n)]) for s in range(3)}
    a = analyse({"grpo": gain, "seed": flat})
    g = a["methods"]["grpo"]
    assert g["gain"] == pytest.approx(0.5) and g["gain_ci"][0] > 0 and a["goal"]["verdict"] == "met"
    assert g["curve"]["0"]["right_answer"] == 0.0 and g["curve"]["10"]["right_answer"] == pytest.approx(0.5)
    assert g["zero_variance_groups"] == pytest.approx(0.5) and g["updates"] == 30
    d = a["seed_minus_grpo"]
    assert d["n"] == 3 and d["mean"] == pytest.approx(0.25 - 0.5) and d["lower"] == 3
    assert d["p_sign"] == 0.25 and d["t_ci"] == (pytest.approx(-0.25), pytest.approx(-0.25)) and d["p_t"] == 0.0  # no spread
    assert analyse({"grpo": flat})["goal"]["verdict"] == "missed"
    one_seed = analyse({"grpo": {0: gain[0]}})["goal"]["verdict"]
    assert one_seed.startswith("not decided: 1 seed(s)") and "clears it" in one_seed


def test_a_finished_run_is_not_run_again_and_other_settings_are_refused(tmp_path):
    out = tmp_path / "grpo-s0"
    out.mkdir()
    config = {"iterations": 3, "out": str(out)}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    (out / "benchmark-done.json").write_text(json.dumps({"config": digest, "wall_s": 12.5}))
    assert run_one(config, out, tmp_path / "log") == 12.5  # no subprocess: there is no train config to run
    with pytest.raises(SystemExit, match="other settings"):
        run_one({**config, "iterations": 4}, out, tmp_path / "log")
    # the same settings finished by an older revision of the method are not this code's run
    with pytest.raises(SystemExit, match="older revision"):
        run_one(config, out, tmp_path / "log", revision=2)


def test_grpo_and_seed_differ_only_in_the_skills_and_the_distillation(tmp_path):
    import argparse

    args = _args()
    grpo, seed = (train_config(args, m, 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / m)
                  for m in ("grpo", "seed"))
    assert grpo["skills"]["source"] == "none" and grpo["trainer"]["opd_coef"] == 0.0
    assert seed["skills"]["source"] == "self" and seed["trainer"]["opd_coef"] > 0
    same = {k for k in grpo if grpo[k] == seed[k]}
    assert same == set(grpo) - {"skills", "trainer", "out"}
    assert grpo["eval"]["num_tasks"] == 80 and grpo["eval"]["temperature"] == 0.0 and grpo["seed"] == 1
    # the oracle bound is SEED with the manifest's skills: the same run but for who writes them
    oracle = train_config(args, "seed-oracle", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / "seed")
    assert oracle["skills"] == {"source": "external", "chat_model": "bench.atlas_skills:OracleSkills",
                                "chat_model_kwargs": {"style": "specific"}, "max_tokens": 64}
    assert {k for k in oracle if oracle[k] != seed[k]} == {"skills"}
    # so is the episode-rule method: its skills read off each episode, no manifest
    episode = train_config(args, "seed-episode", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / "seed")
    assert episode["skills"] == {"source": "external", "chat_model": "bench.atlas_skills:EpisodeSkills",
                                 "chat_model_kwargs": {"failures": "name"}, "max_tokens": 64}
    assert {k for k in episode if episode[k] != seed[k]} == {"skills"}
    # and its successes-only variant differs from it in the failure rule alone (a digest of its own)
    success = train_config(args, "seed-success", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / "seed")
    assert success["skills"] == {**episode["skills"], "chat_model_kwargs": {"failures": "none"}}
    assert {k for k in success if success[k] != episode[k]} == {"skills"}
    generic = train_config(args, "seed-success-generic", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80,
                           tmp_path / "seed")  # the control: the success rule's content alone differs
    assert generic["skills"] == {**success["skills"], "chat_model_kwargs": {"failures": "none", "successes": "generic"}}
    # the faster decode paths reach the run when asked for (the KV cache as an engine option, not a
    # config key), and leave every digest alone when not
    faster = argparse.Namespace(**{**vars(args), "kv_cache": "static", "attention": "float32"})
    fast_grpo = train_config(faster, "grpo", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / "grpo")
    assert fast_grpo["backend"] == {**grpo["backend"], "attention": "float32"}
    assert fast_grpo["local_engine"] == {"kv_cache": "static"} and "local_engine" not in grpo
    assert "attention" not in grpo["backend"]
    # the imitation control: the generic run with the gate off, and nothing else moved
    imitate = train_config(args, "seed-success-imitate", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80,
                           tmp_path / "seed")
    assert imitate["trainer"] == {**generic["trainer"], "gate_sharpness": 0.0}
    assert {k for k in imitate if imitate[k] != generic[k]} == {"trainer"}
    assert "gate_sharpness" not in generic["trainer"]  # the gated methods keep their digests
    # another OPD weight moves the skill methods only: GRPO's run (and its stored digest) stays as it was
    heavier = argparse.Namespace(**{**vars(args), "opd_coef": 0.1})
    assert train_config(heavier, "grpo", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / "grpo") == grpo
    assert train_config(heavier, "seed-oracle", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80,
                        tmp_path / "seed")["trainer"]["opd_coef"] == 0.1
    assert seed["trainer"]["opd_coef"] == 0.01  # the default is the paper's lambda
    # so does another skill placement, and the system block (the default) keeps the digests it had
    moved = argparse.Namespace(**{**vars(args), "injector": "last_turn"})
    assert train_config(moved, "grpo", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / "grpo") == grpo
    assert train_config(moved, "seed", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80,
                        tmp_path / "seed")["skills"] == {**seed["skills"], "injector": "last_turn"}
    assert "injector" not in seed["skills"]
    # the fused teacher: a trainer setting of the skill methods when on, nothing (and no digest moved) when off
    fused = argparse.Namespace(**{**vars(args), "fuse_teacher": True})
    assert train_config(fused, "grpo", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / "grpo") == grpo
    assert train_config(fused, "seed", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80,
                        tmp_path / "seed")["trainer"] == {**seed["trainer"], "fuse_teacher": True}
    assert "fuse_teacher" not in seed["trainer"]
    # the described reply example: the policy's own skills only (the others read no example), digests kept when off
    described = argparse.Namespace(**{**vars(args), "answer_format": "described"})
    for m, base in (("grpo", grpo), ("seed-oracle", oracle)):
        assert train_config(described, m, 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / m) == {
            **base, "out": str(tmp_path / m)}
    assert train_config(described, "seed", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80,
                        tmp_path / "seed")["skills"] == {**seed["skills"], "answer_format": "described"}
    assert "answer_format" not in seed["skills"]
    # the call opening and skipped failures: the same rule
    for key, value, setting in (("skill_opening", "call", "opening"), ("skill_failures", "skip", "failures")):
        moved = argparse.Namespace(**{**vars(args), key: value})
        for m, base in (("grpo", grpo), ("seed-oracle", oracle)):
            assert train_config(moved, m, 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / m) == {
                **base, "out": str(tmp_path / m)}
        assert train_config(moved, "seed", 1, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80,
                            tmp_path / "seed")["skills"] == {**seed["skills"], setting: value}
        assert setting not in seed["skills"]


def test_every_skill_method_is_paired_with_grpo_by_seed():
    n = 40
    gain = {s: _run([False] * n, [i % 2 == 0 for i in range(n)]) for s in range(3)}
    flat = {s: _run([i % 4 == 0 for i in range(n)], [i % 4 == 0 for i in range(n)]) for s in range(3)}
    a = analyse({"grpo": flat, "seed": flat, "seed-oracle": gain})
    assert a["seed_minus_grpo"]["mean"] == pytest.approx(0.0) and a["seed_minus_grpo"]["equal"] == 3
    d = a["seed_oracle_minus_grpo"]
    assert d["n"] == 3 and d["mean"] == pytest.approx(0.5 - 0.25) and d["higher"] == 3
    assert "seed_oracle_minus_grpo" not in analyse({"seed-oracle": gain, "seed": flat})
    assert analyse({"grpo": flat, "seed-episode": gain})["seed_episode_minus_grpo"]["higher"] == 3


def test_a_run_packs_into_the_result_file_and_unpacks_unchanged():
    from bench.learning_curve import pack_run, unpack_run

    run = _run([True, False, False], [True, True, False])
    run["scores"][10]["h1"]["fault"] = True
    del run["scores"][0]["h2"]  # a task an evaluation did not reach stays absent
    packed = json.loads(json.dumps(pack_run(run, "abc", 12.0)))  # what the file holds
    assert packed["scores"]["0"]["right_answer"] == "10-" and packed["scores"]["10"]["fault"] == "010"
    assert unpack_run(packed) == run


def test_a_run_kept_in_the_result_file_is_read_not_trained_again(tmp_path, monkeypatch):
    import bench.learning_curve as lc

    argv = ["--methods", "grpo", "--seeds", "0", "--updates", "2", "--train-tasks", "4", "--heldout", "3",
            "--work", str(tmp_path / "work"), "--results-dir", str(tmp_path / "results")]
    trained = []

    def fake_run_one(config, out, log, revision=1):  # what training leaves: eval trajectories and metrics
        trained.append(out.name)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "success_rate": 0.25,
                                                                "zero_variance_groups": 0.5}) + "\n" for i in range(2)))
        return 7.0

    scores = {0: {f"atlas-heldout-L0-00{i}": {"parsed": True, "right_calls": False, "right_answer": False, "fault": False}
                  for i in range(3)}}
    scores[2] = {t: {**v, "right_calls": True, "right_answer": True} for t, v in scores[0].items()}
    monkeypatch.setattr(lc, "run_one", fake_run_one)
    monkeypatch.setattr(lc, "heldout_scores", lambda out, heldout: scores)
    lc.main(argv)
    first = json.loads((tmp_path / "results" / "learning_curve.json").read_text())["results"]
    assert trained == ["grpo-s0"] and first["methods"]["grpo"]["gain"] == 1.0

    # a fresh checkout: no run folders, only the result file
    import shutil

    shutil.rmtree(tmp_path / "work")
    monkeypatch.setattr(lc, "heldout_scores", lambda out, heldout: pytest.fail("read from the folder"))
    lc.main(argv)
    again = json.loads((tmp_path / "results" / "learning_curve.json").read_text())["results"]
    assert trained == ["grpo-s0"] and again["methods"] == first["methods"] and again["runs"] == first["runs"]

    # other settings are another run: trained, not read
    monkeypatch.setattr(lc, "heldout_scores", lambda out, heldout: scores)
    lc.main([*argv, "--lr", "3e-4"])
    assert trained == ["grpo-s0", "grpo-s0"]

    # a variant under its own name leaves the main curve's file alone
    main_file = (tmp_path / "results" / "learning_curve.json").read_text()
    lc.main([*argv, "--result-name", "learning_curve_variant"])
    assert (tmp_path / "results" / "learning_curve_variant.json").exists()
    assert (tmp_path / "results" / "learning_curve_variant.png").exists()
    assert (tmp_path / "results" / "learning_curve.json").read_text() == main_file


def test_each_finished_run_reaches_the_result_file_before_the_next_one_trains(tmp_path, monkeypatch, capsys):
    """A run takes an hour; a session that ends during the second keeps the first in the file."""
    import shutil

    import bench.learning_curve as lc
    from scripts import readme_tables as tables
    from bench.results import load_result

    argv = ["--methods", "grpo,seed", "--seeds", "0,1", "--updates", "2", "--train-tasks", "4", "--heldout", "3",
            "--work", str(tmp_path / "work"), "--results-dir", str(tmp_path / "results")]
    trained = []
    fake_run_one, scores = _fake_training(trained, stop_at="seed-s0")  # the session ends during the second run
    monkeypatch.setattr(lc, "run_one", fake_run_one)
    monkeypatch.setattr(lc, "heldout_scores", lambda out, heldout: scores)
    with pytest.raises(KeyboardInterrupt):
        lc.main(argv)
    path = tmp_path / "results" / "learning_curve.json"
    partial = json.loads(path.read_text())["results"]
    assert list(partial["runs"]) == ["grpo-s0"] and partial["pending"] == ["seed-s0", "grpo-s1", "seed-s1"]
    assert "so far: 3 run(s) still to train (seed-s0, grpo-s1, seed-s1)" in capsys.readouterr().out
    text = "\n".join(tables.learning_curve({"learning_curve": load_result(path)}))
    assert "Partial: 3 run(s)" in text and "seed-s0" in text and "| grpo | 2 |" in text  # 2 updates of its one run

    shutil.rmtree(tmp_path / "work")  # a fresh checkout: only the file is left
    lc.main(argv)
    final = json.loads(path.read_text())["results"]
    assert trained == ["grpo-s0", "seed-s0", "seed-s0", "grpo-s1", "seed-s1"]  # grpo-s0 read back, not trained again
    assert "pending" not in final and set(final["runs"]) == {"grpo-s0", "seed-s0", "grpo-s1", "seed-s1"}
    assert final["runs"]["grpo-s0"] == partial["runs"]["grpo-s0"]
    assert "Partial" not in "\n".join(tables.learning_curve({"learning_curve": load_result(path)}))
    # the comparison prints its crossed interval and its p read against the family (here: itself)
    out = capsys.readouterr().out
    assert "SEED - GRPO (final held-out, paired by seed, n=2): +0.000, 95% bootstrap CI [+0.000, +0.000] over seeds x " in out
    assert "Holm p 1.000 over 1 variant;" in out and "learning_curve*.json, 1 in all" in out


def test_the_run_digest_ignores_where_the_files_live_but_not_what_they_hold(tmp_path):
    import argparse

    from bench.learning_curve import run_digest

    args = _args()
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "t.jsonl").write_text("t\n")
        (tmp_path / d / "h.jsonl").write_text("h\n")

    def digest(d, **change):
        cfg = train_config(argparse.Namespace(**{**vars(args), **change}), "grpo", 0, tmp_path / d / "t.jsonl",
                           tmp_path / d / "h.jsonl", 1, 1, tmp_path / d / "out")
        return run_digest(cfg, tmp_path / d / "t.jsonl", tmp_path / d / "h.jsonl")

    assert digest("a") == digest("b") != digest("a", lr=3e-4)
    # the number format is a setting of the run only when not fp32: fp32 runs keep their digests
    assert digest("a", precision="auto") != digest("a")
    bf16 = train_config(argparse.Namespace(**{**vars(args), "precision": "bfloat16"}), "grpo", 0, tmp_path / "a" / "t.jsonl",
                        tmp_path / "a" / "h.jsonl", 1, 1, tmp_path / "a" / "out")
    assert bf16["backend"]["precision"] == "bfloat16"
    assert "precision" not in train_config(args, "grpo", 0, tmp_path / "a" / "t.jsonl", tmp_path / "a" / "h.jsonl", 1, 1,
                                           tmp_path / "a" / "out")["backend"]
    (tmp_path / "b" / "h.jsonl").write_text("other\n")
    assert digest("a") != digest("b")


def test_a_guide_share_changes_the_run_only_when_on_and_needs_a_free_first_turn(tmp_path, capsys):
    import argparse

    import bench.learning_curve as lc

    args = _args(first_turn="auto")
    (tmp_path / "t.jsonl").write_text("t\n")
    (tmp_path / "h.jsonl").write_text("h\n")

    def config(**change):
        return train_config(argparse.Namespace(**{**vars(args), **change}), "grpo", 0, tmp_path / "t.jsonl",
                            tmp_path / "h.jsonl", 1, 1, tmp_path / "out")

    off, on = config(), config(guide_share=0.5)
    # off, the trainer section is what it was before the option existed: stored runs keep their digests
    assert "guide_share" not in off["trainer"] and on["trainer"]["guide_share"] == 0.5
    # so with the learning-rate schedule: TRL's linear decay leaves the section as it was
    assert "lr_schedule" not in off["trainer"] and config(lr_schedule="constant")["trainer"]["lr_schedule"] == "constant"
    assert off["graph"]["build"].endswith(":build_auto_agent")
    assert config(first_turn="forced")["graph"]["build"].endswith(":build_agent")  # the stored runs' digests stay
    assert config(first_turn="forced-two")["graph"]["build"].endswith(":build_two_call_agent")
    assert config(first_turn="lookup-add")["graph"]["build"].endswith(":build_lookup_add_agent")
    assert lc.run_digest(off, tmp_path / "t.jsonl", tmp_path / "h.jsonl") != lc.run_digest(on, tmp_path / "t.jsonl",
                                                                                            tmp_path / "h.jsonl")
    for argv, message in ((["--guide-share", "0.5"], "needs --first-turn auto"),
                          (["--first-turn", "auto", "--guide-share", "2"], "a share in"),
                          (["--result-name", "../x"], "--result-name"), (["--opd-coef", "-1"], "a weight >= 0"),
                          # --methods bogus: were the check gone, main would stop there, not start a run
                          (["--attention", "float32", "--methods", "bogus"], "changes only bf16 runs")):
        with pytest.raises(SystemExit):
            lc.main([*argv, "--work", str(tmp_path / "w")])
        assert message in capsys.readouterr().err


def test_quoted_answers_counts_final_answers_that_copy_a_tool_response(tmp_path):
    """Right by the verifier, a form no user asked for: the share per evaluation, faulted
    episodes left out, only the last policy call's text read."""
    from bench.learning_curve import quoted_answers
    from seed_agents.types import FaultKind, LLMCall, Trajectory

    def episode(iteration: int, *texts: str, fault: FaultKind | None = None) -> str:
        calls = [LLMCall(call_id=f"c{i}", messages=[], prompt_ids=[1], completion_ids=[2], logprobs=[-0.1], text=t)
                 for i, t in enumerate(texts)]
        return Trajectory(task_id="t", group_id="g", calls=calls, fault=fault,
                          metadata={"iteration": iteration}).model_dump_json() + "\n"

    call = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
    (tmp_path / "eval_trajectories.jsonl").write_text(
        episode(-1, "The answer is: 2018")
        + episode(7, call, "<tool_response>\nThe population of X is 5.\n</tool_response>")
        + episode(7, "  <tool_response>\n5\n</tool_response>")
        + episode(7, call, "The population of X is 5.")
        + episode(7, call, "<tool_response>x</tool_response>", fault=FaultKind.BACKEND))
    assert quoted_answers(tmp_path) == {"0": 0.0, "8": pytest.approx(2 / 3)}


def test_skill_content_counts_what_valid_skills_name_about_their_own_task(tmp_path):
    """The oracle's skill names the tool and every argument; a skill about another task, or
    a number inside a longer one, names nothing; invalid skills are not counted."""
    from bench.atlas_skills import oracle_skill
    from bench.learning_curve import skill_content

    lookup = {"question": "What is the population of Zixpis?", "answer": 36375,
              "calls": [{"name": "lookup", "args": {"place": "Zixpis", "field": "population"}}]}
    add = {"question": "What is 12 + 30?", "answer": 42, "calls": [{"name": "add", "args": {"a": 12, "b": 30}}]}
    tasks = tmp_path / "train.jsonl"
    tasks.write_text(json.dumps({"task_id": "a", "data": lookup}) + "\n" + json.dumps({"task_id": "b", "data": add}) + "\n")
    skills = [("a", oracle_skill(lookup, "specific"), True),   # tool + args
              ("a", "The population of Zixpis is 36375.", True),  # args + answer, no tool
              ("b", "Call add with 12 and 300 to get 4200.", True),  # tool; 300 is not 30, 4200 not 42
              ("b", "Use lookup for Zixpis population.", True),  # another task's words: nothing
              ("a", "call lookup with place Zixpis and field population", False)]  # invalid: not counted
    (tmp_path / "skills.jsonl").write_text("".join(json.dumps({"task_id": t, "skill": k, "valid": v}) + "\n"
                                                   for t, k, v in skills))
    assert skill_content(tmp_path, tasks) == {"valid": 4.0, "names_tool": 0.5, "names_args": 0.5, "names_answer": 0.25}
    (tmp_path / "skills.jsonl").write_text("")
    assert skill_content(tmp_path, tasks) == {}


def test_a_benchmark_killed_with_sigterm_stops_the_training_run_it_started(tmp_path):
    """``kill PID`` on the benchmark reaches only it; its training child must not run on alone."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    fake = tmp_path / "python"  # stands in for the interpreter run_one starts `-m seed_agents train` with
    pidfile = tmp_path / "child.pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")
    fake.chmod(0o755)
    argv = ["bench/learning_curve.py", "--methods", "grpo", "--seeds", "0", "--updates", "1", "--train-tasks", "4",
            "--heldout", "3", "--work", str(tmp_path / "work"), "--results-dir", str(tmp_path / "results")]
    script = (f"import runpy, sys; sys.executable = {str(fake)!r}; sys.argv = {argv!r}; "
              "runpy.run_path('bench/learning_curve.py', run_name='__main__')")
    bench = subprocess.Popen([sys.executable, "-c", script], cwd=root)
    child = None
    try:
        deadline = time.monotonic() + 300  # bounds, not expectations: a loaded machine's imports take long
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pidfile.read_text())
        os.kill(bench.pid, signal.SIGTERM)
        bench.wait(timeout=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the training child outlived the benchmark")
        assert bench.returncode == 128 + signal.SIGTERM  # ended through SystemExit, as Ctrl-C ends it
        assert not (tmp_path / "work" / "grpo-s0" / "benchmark-done.json").exists()
    finally:
        bench.kill()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_run_another_curve_file_holds_is_read_from_there_by_its_digest(tmp_path, monkeypatch):
    import bench.learning_curve as lc

    argv = ["--methods", "grpo", "--seeds", "0", "--updates", "2", "--train-tasks", "4", "--heldout", "3",
            "--work", str(tmp_path / "work"), "--results-dir", str(tmp_path / "results")]
    trained = []

    def fake_run_one(config, out, log, revision=1):
        trained.append(out.name)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "success_rate": 0.25,
                                                                "zero_variance_groups": 0.5}) + "\n" for i in range(2)))
        return 7.0

    scores = {u: {f"atlas-heldout-L0-00{i}": {"parsed": True, "right_calls": u > 0, "right_answer": u > 0 and i > 0,
                                              "fault": False} for i in range(3)} for u in (0, 2)}
    monkeypatch.setattr(lc, "run_one", fake_run_one)
    monkeypatch.setattr(lc, "heldout_scores", lambda out, heldout: scores)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "learning_curve_broken.json").write_text("{")  # another file's damage is not ours
    lc.main([*argv, "--result-name", "learning_curve_a"])
    import shutil

    shutil.rmtree(tmp_path / "work")  # a fresh checkout: only the result files
    lc.main([*argv, "--result-name", "learning_curve_b"])
    b = json.loads((tmp_path / "results" / "learning_curve_b.json").read_text())["results"]
    a = json.loads((tmp_path / "results" / "learning_curve_a.json").read_text())["results"]
    assert trained == ["grpo-s0"] and b["read_from"] == {"grpo-s0": "learning_curve_a"} and b["runs"] == a["runs"]
    lc.main([*argv, "--result-name", "learning_curve_c", "--lr", "3e-4"])  # another digest: trained, not read
    assert trained == ["grpo-s0", "grpo-s0"]
    c = json.loads((tmp_path / "results" / "learning_curve_c.json").read_text())["results"]
    assert c["read_from"] == {}


def test_a_revised_method_does_not_read_runs_its_older_code_trained(tmp_path, monkeypatch, capsys):
    """A digest names settings and tasks, not code: a method whose code changed what it does
    (REVISIONS) must train again, not read a stored run of the same settings back, while an
    unrevised method's stored runs stay readable. Two files that disagree on one digest are
    both passed over, loudly."""
    import shutil

    import bench.learning_curve as lc

    argv = ["--methods", "grpo,seed", "--seeds", "0", "--updates", "2", "--train-tasks", "4", "--heldout", "3",
            "--work", str(tmp_path / "work"), "--results-dir", str(tmp_path / "results")]
    trained = []

    def fake_run_one(config, out, log, revision=1):
        trained.append((out.name, revision))
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "success_rate": 0.25}) + "\n")
        return 7.0

    right = [True]
    monkeypatch.setattr(lc, "run_one", fake_run_one)
    monkeypatch.setattr(lc, "heldout_scores", lambda out, heldout: {
        u: {f"t{i}": {"parsed": True, "right_calls": True, "right_answer": right[0] and u > 0, "fault": False}
            for i in range(3)} for u in (0, 2)})
    monkeypatch.setattr(lc, "REVISIONS", {})  # as the code stood before the fix
    lc.main([*argv, "--result-name", "learning_curve_old"])
    shutil.rmtree(tmp_path / "work")
    monkeypatch.setattr(lc, "REVISIONS", {"seed": 2})
    lc.main([*argv, "--result-name", "learning_curve_new"])
    new = json.loads((tmp_path / "results" / "learning_curve_new.json").read_text())["results"]
    assert trained == [("grpo-s0", 1), ("seed-s0", 1), ("seed-s0", 2)]
    assert new["read_from"] == {"grpo-s0": "learning_curve_old"} and new["runs"]["seed-s0"]["revision"] == 2
    assert "revision" not in new["runs"]["grpo-s0"]

    # a GRPO run of the same digest that scored otherwise in a third file: neither copy is read
    right[0] = False
    shutil.rmtree(tmp_path / "work")
    lc.main([*argv, "--methods", "grpo", "--result-name", "learning_curve_other", "--lr", "3e-4"])
    other = json.loads((tmp_path / "results" / "learning_curve_other.json").read_text())
    other["results"]["runs"]["grpo-s0"] = {**new["runs"]["grpo-s0"],
                                          "scores": other["results"]["runs"]["grpo-s0"]["scores"]}
    (tmp_path / "results" / "learning_curve_other.json").write_text(json.dumps(other))
    shutil.rmtree(tmp_path / "work")
    capsys.readouterr()
    lc.main([*argv, "--methods", "grpo", "--result-name", "learning_curve_third"])
    assert trained[-1] == ("grpo-s0", 1) and len(trained) == 5
    out = capsys.readouterr().out
    assert "learning_curve_new.json and learning_curve_other.json hold run" in out and "reading neither" in out


def _played_initial_eval(work, name, config, episodes=2, later=True):
    """A run folder as `train` leaves it after its initial evaluation (and one later one)."""
    out = work / name
    out.mkdir(parents=True)
    (work / f"{name}.json").write_text(json.dumps(config))
    trajs = [{"task_id": f"h{i}", "metadata": {"iteration": -1}} for i in range(episodes)]
    rows = [{"iteration": -1, "updates": 0, "episodes": episodes}]
    if later:
        trajs += [{"task_id": f"h{i}", "metadata": {"iteration": 3}} for i in range(episodes)]
        rows.append({"iteration": 3, "updates": 4, "episodes": episodes})
    (out / "eval_trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trajs) + '{"task_id": "half')
    (out / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_a_run_starts_with_the_initial_evaluation_a_sibling_played_only_when_it_is_the_same(tmp_path):
    from bench.learning_curve import INITIAL_EVAL_FROM, initial_eval_key, reuse_initial_eval

    work = tmp_path / "work"
    curve = _args(updates=8, temperature=0.5, lr=3e-4, eval_every=4, lr_schedule="constant", opd_coef=0.1,
                  skill_failures="skip")
    grpo = train_config(curve, "grpo", 0, work / "t.jsonl", work / "h.jsonl", 4, 2, work / "grpo-s0")
    seed = train_config(curve, "seed", 1, work / "t.jsonl", work / "h.jsonl", 4, 2, work / "seed-s1")
    assert initial_eval_key(grpo) == initial_eval_key(seed)  # seed, method and training settings do not reach it
    sibling = _played_initial_eval(work, "grpo-s0", grpo)
    assert reuse_initial_eval(seed, work / "seed-s1", work) == "grpo-s0"
    copied = work / "seed-s1"
    initial = (sibling / "eval_trajectories.jsonl").read_text().splitlines()[:2]
    assert (copied / "eval_trajectories.jsonl").read_text().splitlines() == initial
    assert [json.loads(x)["iteration"] for x in (copied / "eval.jsonl").read_text().splitlines()] == [-1]
    assert json.loads((copied / INITIAL_EVAL_FROM).read_text()) == {"run": "grpo-s0"}
    assert reuse_initial_eval(seed, copied, work) is None  # a folder that holds something is left alone

    # another backend, a sampled evaluation or no initial one: the run plays its own
    for other in ({**seed, "backend": {**seed["backend"], "precision": "bfloat16"}},
                  {**seed, "eval": {**seed["eval"], "temperature": 0.7}},
                  {**seed, "eval": {**seed["eval"], "at_start": False}},
                  {**seed, "graph": {**seed["graph"], "build": "examples.atlas_tasks:build_auto_agent"}}):
        assert reuse_initial_eval(other, tmp_path / "fresh", work) is None and not (tmp_path / "fresh").exists()
    # an evaluation that samples is each run's own, even beside a sibling that sampled it alike
    sampled = {**grpo, "eval": {**grpo["eval"], "temperature": 0.7}}
    _played_initial_eval(tmp_path / "sampling", "grpo-s0", sampled)
    assert reuse_initial_eval({**sampled, "seed": 1}, tmp_path / "sampling" / "grpo-s1", tmp_path / "sampling") is None
    # a sibling whose initial trajectories fall short of its row is not copied
    lone = tmp_path / "lone"
    short = _played_initial_eval(lone, "grpo-s0", grpo, later=False)
    (short / "eval_trajectories.jsonl").write_text((short / "eval_trajectories.jsonl").read_text().splitlines()[0] + "\n")
    assert reuse_initial_eval(seed, lone / "seed-s1", lone) is None


@pytest.mark.parametrize("folders, stop_at", [("gone", "seed-s1"), ("kept", "seed-s0")])
def test_a_result_file_rewritten_mid_invocation_keeps_the_runs_it_held_that_come_later(tmp_path, monkeypatch,
                                                                                       folders, stop_at):
    """GRPO on two seeds, then SEED added beside it and killed during one of its runs: the file
    it rewrote still holds grpo-s1 (an hour of training), whether the GRPO runs come back from
    the file (a fresh checkout; killed after seed-s0 was written) or from their finished folders
    (the same session; killed during seed-s0, after a finished folder's run was written)."""
    import shutil

    import bench.learning_curve as lc

    base = ["--seeds", "0,1", "--updates", "2", "--train-tasks", "4", "--heldout", "3",
            "--work", str(tmp_path / "work"), "--results-dir", str(tmp_path / "results")]
    trained = []
    fake_run_one, scores = _fake_training(trained, stop_at=stop_at)  # the session ends during that run
    monkeypatch.setattr(lc, "run_one", fake_run_one)
    monkeypatch.setattr(lc, "heldout_scores", lambda out, heldout: scores)
    lc.main(["--methods", "grpo", *base])
    path = tmp_path / "results" / "learning_curve.json"
    grpo_only = json.loads(path.read_text())["results"]["runs"]
    if folders == "gone":
        shutil.rmtree(tmp_path / "work")  # a later session: only the file is left
    with pytest.raises(KeyboardInterrupt):
        lc.main(["--methods", "grpo,seed", *base])
    partial = json.loads(path.read_text())["results"]
    assert trained[:2] == ["grpo-s0", "grpo-s1"] and not {"grpo-s0", "grpo-s1"} & set(trained[2:])  # neither again
    assert {"grpo-s0", "grpo-s1"} <= set(partial["runs"]) and partial["runs"]["grpo-s1"] == grpo_only["grpo-s1"]


def test_a_runs_engine_options_reach_train_as_its_environment_and_stay_in_its_digest(tmp_path, monkeypatch):
    """--kv-cache static is the local backend's engine option: the file `train` reads has no such
    key (the user config refuses it), `train` gets it through SEED_AGENTS_BENCH_LOCAL_ENGINE, and
    the run's digest names it."""
    import bench.learning_curve as lc
    from seed_agents.config import TrainConfig

    seen = []
    monkeypatch.setattr(lc, "run_logged", lambda cmd, log, env: seen.append(env) or (0, 1.0))
    for kv_cache, out in (("static", "static-s0"), ("dynamic", "dynamic-s0")):
        config = train_config(_args(kv_cache=kv_cache), "grpo", 0, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80,
                              tmp_path / out)
        (tmp_path / out).mkdir()
        run_one(config, tmp_path / out, tmp_path / "log")
        written = json.loads((tmp_path / f"{out}.json").read_text())
        assert "local_engine" not in written and "kv_cache" not in written["backend"]
        TrainConfig.model_validate(written)
    assert seen == [{"SEED_AGENTS_BENCH_LOCAL_ENGINE": '{"kv_cache": "static"}'}, {"SEED_AGENTS_BENCH_LOCAL_ENGINE": "{}"}]
    static = train_config(_args(kv_cache="static"), "grpo", 0, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path)
    dynamic = train_config(_args(), "grpo", 0, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path)
    (tmp_path / "t.jsonl").write_text("")
    (tmp_path / "h.jsonl").write_text("")
    assert lc.run_digest(static, tmp_path / "t.jsonl", tmp_path / "h.jsonl") != \
        lc.run_digest(dynamic, tmp_path / "t.jsonl", tmp_path / "h.jsonl")


@pytest.mark.parametrize("precision, attention", [("float32", "same"), ("auto", "same"), ("auto", "float32")])
def test_a_run_computes_in_the_format_its_digest_names_though_the_defaults_moved(tmp_path, monkeypatch, precision,
                                                                                attention):
    """backend.precision and backend.attention default to auto now; a stored run's config
    names neither when it was fp32 (or bf16 attention), so the file `train` reads must pin
    them, or an fp32 curve resumed or rerun here would train in bf16 under an fp32 digest."""
    import bench.learning_curve as lc
    from seed_agents.config import TrainConfig

    monkeypatch.setattr(lc, "run_logged", lambda cmd, log, env: (0, 1.0))
    args = _args(precision=precision, attention=attention)
    config = train_config(args, "grpo", 0, tmp_path / "t.jsonl", tmp_path / "h.jsonl", 200, 80, tmp_path / "grpo-s0")
    assert "attention" not in config["backend"] or attention != "same"  # the digest's config names no moved default
    (tmp_path / "grpo-s0").mkdir()
    run_one(config, tmp_path / "grpo-s0", tmp_path / "log")
    written = TrainConfig.model_validate(json.loads((tmp_path / "grpo-s0.json").read_text()))
    assert (written.backend.precision, written.backend.attention) == (precision, attention)
    done = json.loads((tmp_path / "grpo-s0" / "benchmark-done.json").read_text())
    assert done["config"] == hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def test_paired_matrices_keep_the_common_seeds_and_tasks_sorted():
    from bench.learning_curve import paired_matrices

    a = {2: {"t1": 1.0, "t0": 0.0, "t9": 1.0}, 0: {"t0": 1.0, "t1": 0.0}}
    b = {0: {"t1": 1.0, "t0": 1.0}, 2: {"t0": 0.0, "t1": 0.0}, 5: {"t0": 1.0, "t1": 1.0}}
    left, right = paired_matrices(a, b)
    assert left.tolist() == [[1.0, 0.0], [0.0, 1.0]] and right.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert paired_matrices({}, b)[0].shape == (0, 0)


def test_the_crossed_interval_is_wider_than_tasks_resampled_within_seeds_when_seeds_share_hard_tasks():
    """Every seed solves the same half of the tasks after training (the same ones are hard in
    every run): the gain's uncertainty is the tasks', which resampling within each of three seeds
    divides by about sqrt(3)."""
    n = 40
    same = {s: _run([False] * n, [i % 2 == 0 for i in range(n)]) for s in range(3)}
    g = analyse({"grpo": same})["methods"]["grpo"]
    crossed, nested = g["gain_crossed_ci"], g["gain_ci"]
    assert crossed[0] < nested[0] < 0.5 < nested[1] < crossed[1]
    assert (crossed[1] - crossed[0]) / (nested[1] - nested[0]) == pytest.approx(3 ** 0.5, rel=0.2)
    assert g["gain_t_ci"] == (pytest.approx(0.5), pytest.approx(0.5))  # every seed gains 0.5: no spread over seeds
    other = {s: _run([False] * n, [i % 4 == 0 for i in range(n)]) for s in range(3)}
    d = analyse({"grpo": other, "seed": same})["seed_minus_grpo"]
    assert d["crossed_ci"][0] < 0.25 < d["crossed_ci"][1] and d["ci"] == (pytest.approx(0.25), pytest.approx(0.25))


def _curve(runs: dict[str, dict], seeds: list[int]) -> dict:
    """A learning-curve file as comparison_family reads it: packed runs and the methods they hold."""
    from bench.learning_curve import pack_run

    packed = {name: pack_run(run, f"d-{name}-{id(run)}", 1.0) for name, run in runs.items()}
    return {"config": {"seeds": seeds}, "results": {"methods": {n.rpartition("-s")[0]: {} for n in runs}, "runs": packed}}


def test_the_family_is_every_seed_variant_against_grpo_each_counted_once():
    from bench.learning_curve import comparison_family

    n = 20
    grpo = {s: _run([False] * n, [i < 5 + s for i in range(n)]) for s in range(3)}
    better = {s: _run([False] * n, [i < 10 + 2 * s for i in range(n)]) for s in range(3)}
    noise = {s: _run([False] * n, [i < [3, 9, 6][s] for i in range(n)]) for s in range(3)}
    main = _curve({**{f"grpo-s{s}": r for s, r in grpo.items()}, **{f"seed-s{s}": r for s, r in better.items()}}, [0, 1, 2])
    variant = _curve({**{f"grpo-s{s}": r for s, r in grpo.items()}, **{f"seed-episode-s{s}": r for s, r in noise.items()}},
                     [0, 1, 2])
    pilot = _curve({"grpo-s0": grpo[0], "seed-oracle-s0": better[0]}, [0])
    # a file that read the main curve's seed runs back holds them again: not another variant
    again = {"config": main["config"], "results": {**main["results"], "methods": {"seed": {}}}}
    family = comparison_family({"lc": main, "lc_episode": variant, "lc_oracle": pilot, "lc_x": again})
    assert sorted(family) == ["lc:seed", "lc_episode:seed-episode", "lc_oracle:seed-oracle"]
    claims = {k: d["claim"] for k, d in family.items()}
    assert {c.variants for c in claims.values()} == {3}
    assert claims["lc_oracle:seed-oracle"].p is None and claims["lc_oracle:seed-oracle"].p_holm is None  # one seed
    # seed minus GRPO by seed: 5/20 + s/20 each, t-test p below 0.001; times 3 variants
    p = claims["lc:seed"].p
    assert family["lc:seed"]["mean"] == pytest.approx(0.3) and claims["lc:seed"].p_holm == pytest.approx(min(1.0, 3 * p))
    episode = claims["lc_episode:seed-episode"]
    assert episode.p_holm == pytest.approx(min(1.0, max(3 * p, 2 * episode.p)))


def test_a_preregistered_file_is_a_family_of_its_own():
    """Its comparison was fixed before it ran: no Holm correction over the variants tried on the
    held-out set, and it does not widen theirs."""
    from bench.learning_curve import comparison_family

    def curve(tag: str) -> dict:  # another file's runs, with their own digests
        n = 20
        c = _curve({**{f"grpo-s{s}": _run([False] * n, [i < 5 + s for i in range(n)]) for s in range(3)},
                    **{f"seed-s{s}": _run([False] * n, [i < 10 + 2 * s for i in range(n)]) for s in range(3)}}, [0, 1, 2])
        for name, run in c["results"]["runs"].items():
            run["digest"] = f"{tag}-{name}"
        return c

    explored, other, pre = curve("a"), curve("b"), curve("c")
    pre["config"]["preregistration"] = {"path": "bench/preregistered/x.yaml", "commit": "c", "committed_at": "t"}
    family = comparison_family({"lc": explored, "lc_other": other, "lc_pre": pre})
    claims = {k: d["claim"] for k, d in family.items()}
    assert claims["lc_pre:seed"].variants == 1 and claims["lc_pre:seed"].p_holm == pytest.approx(claims["lc_pre:seed"].p)
    assert claims["lc:seed"].variants == 2 and claims["lc_other:seed"].variants == 2
