"""bench/seed_overhead.py's own parts: the placements it accepts, and the load-free token
count beside its timings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.seed_overhead import main, scored_tokens


def test_scored_tokens_counts_a_shared_prefix_once():
    """What the trainer's scoring pass computes: rows that begin alike share their prefix
    (computed once), rows that do not are computed whole."""
    args = SimpleNamespace(chunk_tokens=8192, score_batch_size=16)
    prefix = list(range(100, 140))
    alike = [prefix + [1], prefix + [2], prefix + [3]]
    apart = [[i] + prefix for i in (1, 2, 3)]
    assert scored_tokens(apart, [5, 5, 5], args) == 3 * (41 + 5)
    assert scored_tokens(alike, [5, 5, 5], args) == 40 + 3 * (1 + 5)


@pytest.mark.parametrize("bad", ["end", "system,system", ",", "last_turn+fuse", "fused"])
def test_injectors_must_be_distinct_known_placements(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--injectors", bad])
    assert e.value.code == 2 and "--injectors: distinct names from system, task_line, last_turn, each optionally with +fused" in capsys.readouterr().err


def test_fused_tokens_count_the_padding_of_each_tail_group():
    from bench.seed_overhead import fused_tokens

    assert fused_tokens([60, 68, 58, 66]) == 4 * 68
    assert fused_tokens([68, 58, 66, 62, 144, 169, 156, 141]) == 4 * 68 + 4 * 169


@pytest.mark.parametrize("successes_only", [False, True])
def test_fill_skills_covers_every_episode_or_only_the_successes(successes_only):
    """``full`` gives every episode a valid skill (the placeholder where its own did not parse);
    ``successes`` (skills.failures skip's batch) gives each success one and every failure none,
    even a failure whose analyzer wrote a valid skill."""
    from bench.seed_overhead import FALLBACK_SKILL, fill_skills
    from seed_agents.types import Skill

    def ep(i, success, skill):
        s = None if skill is None else Skill(trajectory_id=f"t{i}", task_id="a", success=success, skill=skill,
                                             valid=skill != "bad", reject_reason="no JSON" if skill == "bad" else None)
        return SimpleNamespace(trajectory_id=f"t{i}", task_id="a", success=success, skill=s)

    trajs = [ep(0, True, "Own words of a success."), ep(1, True, None), ep(2, True, "bad"),
             ep(3, False, "Own words of a failure."), ep(4, False, None)]
    rollout = SimpleNamespace(build=lambda ts: [None if t.skill is None else t.skill.skill for t in ts])
    got = fill_skills(rollout, SimpleNamespace(trajectories=trajs), successes_only=successes_only)
    assert got[:3] == ["Own words of a success.", FALLBACK_SKILL, FALLBACK_SKILL]
    assert got[3:] == ([None, None] if successes_only else ["Own words of a failure.", FALLBACK_SKILL])


@pytest.mark.parametrize("bad", ["../elsewhere", "overhead_x", "seed_overhead_X", "seed_overhead/x"])
def test_a_result_name_outside_the_tables_family_is_refused(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--result-name", bad, "--injectors", "nope"])  # refused first: a broken check fails fast here
    assert e.value.code == 2 and "--result-name: seed_overhead or seed_overhead_<" in capsys.readouterr().err


@pytest.mark.parametrize("flag, on", [([], True), (["--gradient-checkpointing", "off"], False)])
def test_the_timed_update_checkpoints_activations_as_train_does_unless_told_not_to(tiny_model_dir, tmp_path, monkeypatch,
                                                                                   flag, on):
    """``train`` checkpoints by default, but only ``Trainer.train()`` turns it on, and the
    benchmark drives the update itself: without turning it on, it timed (and held in memory)
    an update that keeps every activation."""
    import json

    from bench import seed_overhead

    seen = []
    real = seed_overhead.Updater.__call__

    def spy(self, batch, lam, fuse=False):
        seen.append(self.trainer.model.is_activation_checkpointing)
        return real(self, batch, lam, fuse)

    monkeypatch.setattr(seed_overhead.Updater, "__call__", spy)
    main(["--model", tiny_model_dir, "--env", "fake", "--tasks", "1", "--group", "2", "--max-turns", "1",
          "--analyzer-tokens", "8", "--repeats", "1", "--results-dir", str(tmp_path), *flag])
    assert seen and set(seen) == {on}
    config = json.loads((tmp_path / "seed_overhead_fake.json").read_text())["config"]
    assert config["gradient_checkpointing"] == ("on" if on else "off")


def test_on_the_atlas_the_hindsight_node_judges_success_by_the_reward_function(tiny_model_dir, monkeypatch):
    """The atlas graph sets no success of its own (the runner's reward function judges the
    answer after the graph), so the hindsight node must be handed that judgement, as `train`
    hands it; without it every episode looked failed and, under --skill-failures skip, no skill
    was ever asked for (a run with 0 analyzer calls)."""
    from types import SimpleNamespace

    import examples.atlas_tasks as atlas
    import seed_agents.graphs.hindsight as hindsight
    from bench import seed_overhead

    given = {}
    monkeypatch.setattr(hindsight, "with_hindsight", lambda graph, llm, **kw: given.update(kw) or graph)
    rewards = iter([1.0, 0.0])
    monkeypatch.setattr(atlas, "answer_reward", lambda task, state: next(rewards))
    args = SimpleNamespace(model=tiny_model_dir, seed=0, lora_r=0, tasks=1, group=2, max_tokens=8, temperature=0.5,
                           env="atlas", max_turns=2, analyzer_tokens=8, skill_failures="skip", injectors=["system"],
                           opd_coef=0.1, score_batch_size=4, cache_dir=None)
    seed_overhead.build(args)
    assert given["failures"] == "skip"
    assert given["success_fn"]({"task": None}) is True and given["success_fn"]({"task": None}) is False
