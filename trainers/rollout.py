"""``GraphRollout``: one iteration's episodes, skills, rows and teacher prompts.

Plays the agent graph (wrapped with the hindsight node unless skills are off) over
tasks x G with the runner, then builds training rows from the captured policy calls and,
for every row whose episode has a valid skill, the teacher prompt: the same call's
messages with the skill injected, re-rendered; the completion ids never change.
Ablations are switches here: ``skills="none"`` (plain GRPO rollouts), ``"self"`` (the
policy writes its own skills: SEED), ``"external"`` (another chat model writes them,
OPID-style), ``"frozen"`` (a fixed analyzer backend that is never synced),
``"rule_based"`` (the offline TextWorld analyzer: skills with content the policy did not
write, to measure the distillation term apart from the policy's skill writing).

Faults are not failures: an episode that ended in an infrastructure fault (env crash,
timeout, dead backend, raising reward) is recorded in trajectories.jsonl and counted in
the metrics (``faults/<kind>``) but makes no rows, so it is neither trained on nor part of
its group's advantage statistics; a group left with fewer than two trainable episodes has
no relative signal and is dropped whole. More faults than ``runner.max_fault_fraction``
of the batch stop the run before the optimizer step (``FaultBudgetExceeded``).
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean
from typing import Any, Literal

from seed_agents.aio import run_sync
from seed_agents.capture import JsonlSink, capture
from seed_agents.rows import guided_prefill, trajectory_to_rows
from seed_agents.runner import EpisodeRunner, check_fault_budget, fault_counts
from seed_agents.skills import SkillInjector, SystemBlockInjector, rendered_prompt_ids, teacher_prompt_ids
from seed_agents.trainers.seed_trainer import RolloutBatch
from seed_agents.types import LLMCall, Row, Task, Trajectory

SkillSource = Literal["self", "external", "frozen", "rule_based", "none"]


class GraphRollout:
    """Implements ``trainers.seed_trainer.Rollout`` over an ``EpisodeRunner``.

    ``runner`` plays the (hindsight-wrapped) graph; ``llm`` is the policy chat model used
    to render teacher prompts. Trajectories and skills are appended to ``out_dir`` files
    as each iteration finishes.
    """

    def __init__(self, runner: EpisodeRunner, llm: Any, *, skills: SkillSource = "self",
                 injector: SkillInjector | None = None, merge_rows: bool = True,
                 out_dir: str | Path | None = None) -> None:
        self.runner = runner
        self.llm = llm
        self.skills = skills
        self.injector = injector or SystemBlockInjector()
        self.merge_rows = merge_rows
        self.out_dir = Path(out_dir) if out_dir is not None else None

    def collect(self, tasks: list[Task], group_size: int, iteration: int) -> RolloutBatch:
        self.runner.config = self.runner.config.model_copy(update={"group_size": group_size})
        with capture(iteration=iteration):
            trajs = run_sync(self.runner.run(tasks, group_prefix=f"it{iteration}"))
        for t in trajs:
            t.metadata["iteration"] = iteration
        if self.out_dir is not None:
            with JsonlSink(self.out_dir / "trajectories.jsonl") as sink:
                for t in trajs:
                    sink.write("trajectory", t)
        check_fault_budget(trajs, self.runner.config.max_fault_fraction, what=f"episodes of iteration {iteration}")
        return self.build(trajs, iteration)

    def build(self, trajs: list[Trajectory], iteration: int = 0) -> RolloutBatch:
        rows: list[Row] = []
        teacher: list[list[int] | None] = []
        calls_by_id = {c.call_id: c for t in trajs for c in t.calls}
        for t in trainable_episodes(trajs):
            skill = t.skill if (self.skills != "none" and t.skill is not None and t.skill.valid) else None
            for row in trajectory_to_rows(t, merge=self.merge_rows):
                rows.append(row)
                if skill is None:
                    teacher.append(None)
                    continue
                first = calls_by_id[row.call_ids[0]]
                # Merged rows: the skill goes into the first prompt; every later token of the
                # row (observations, later completions) is unchanged context after it.
                teacher.append(self._teacher_prompt(first, skill.skill))
        self._write_skills(trajs, iteration)
        return RolloutBatch(trajectories=trajs, rows=rows, teacher_prompt_ids=teacher, metrics=self.metrics(trajs))

    def _teacher_prompt(self, call: LLMCall, skill: str) -> list[int]:
        """The call's prompt with the skill in it. A guided opening's row starts at the
        prompt the model was offered (its prefill is trained), so its last, assistant
        message, the prefill, is left out here too: the teacher scores the prefill as well.

        Where the tokenizer merged ids across the seam between the offered prompt and the
        prefill, the row's prompt stops short of the offered render by the merged ids (its
        completion starts with them, ``guided_prefill``); the teacher prompt loses the same
        tail, so that after the skill the teacher sees exactly the row's ids."""
        n = guided_prefill(call)
        if not n:
            return teacher_prompt_ids(self.llm, call, skill, self.injector)
        free = call.model_copy(update={"messages": call.messages[:-1]})
        teacher = teacher_prompt_ids(self.llm, free, skill, self.injector)
        merged = len(rendered_prompt_ids(self.llm, free)) - (len(call.prompt_ids) - n)
        return teacher[:len(teacher) - merged] if merged > 0 else teacher

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Outcome metrics over the episodes that measured the policy (faults excluded),
        plus the fault counts by kind, how many episodes and groups were trained, and the
        fraction of trained groups with zero reward variance (1.0 when none was trained).
        With guided openings, success is also split between guided and free episodes."""
        faults = fault_counts(trajs)
        trained = trainable_episodes(trajs)
        all_trajs, trajs = trajs, [t for t in trajs if t.fault is None]
        n = len(trajs) or 1
        skills = [t.skill for t in trajs if t.skill is not None]
        rewards_of: dict[str, set[float]] = {}
        for t in trained:
            rewards_of.setdefault(t.group_id, set()).add(t.reward)
        return {
            "success_rate": sum(t.success for t in trajs) / n,
            "episodes": float(len(all_trajs)),
            "episodes_trained": float(len(trained)),
            "groups_trained": float(len({t.group_id for t in trained})),
            "groups_dropped": float(len({t.group_id for t in all_trajs}) - len({t.group_id for t in trained})),
            # a group whose episodes all got one reward has zero advantages: no outcome gradient
            "zero_variance_groups": (sum(len(r) == 1 for r in rewards_of.values()) / len(rewards_of)) if rewards_of else 1.0,
            "faults": float(sum(faults.values())),
            **{f"faults/{kind}": float(n_kind) for kind, n_kind in faults.items()},
            "episode_errors": float(sum(t.error is not None for t in all_trajs)),
            "mean_steps": fmean(t.steps for t in trajs) if trajs else 0.0,
            "invalid_action_rate": sum(t.invalid_actions for t in trajs) / max(1, sum(t.steps for t in trajs)),
            "skill_parse_rate": (sum(s.valid for s in skills) / len(trajs)) if trajs and self.skills != "none" else 0.0,
            "policy_version": float(max((c.policy_version for t in trajs for c in t.policy_calls), default=0)),
            **guided_metrics(trajs),
        }

    def _write_skills(self, trajs: list[Trajectory], iteration: int) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with (self.out_dir / "skills.jsonl").open("a", encoding="utf-8") as f:
            for t in trajs:
                if t.skill is not None:
                    f.write(json.dumps({"iteration": iteration, "reward": t.reward, **t.skill.model_dump()}) + "\n")


def guided_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Guided openings' share and the success of guided and of free episodes apart (the
    free one is what an agent left to choose would score); empty when none was guided."""
    guided = [t for t in trajs if any(c.guided for c in t.policy_calls)]
    if not guided:
        return {}
    guided_ids = {t.trajectory_id for t in guided}
    free = [t for t in trajs if t.trajectory_id not in guided_ids]
    return {
        "guided_episodes": float(len(guided)),
        "guided_success_rate": sum(t.success for t in guided) / len(guided),
        "free_success_rate": (sum(t.success for t in free) / len(free)) if free else 0.0,
    }


def trainable_episodes(trajs: list[Trajectory]) -> list[Trajectory]:
    """The episodes that may be trained on: no infrastructure fault, in a group that
    still has at least two such episodes (a lone episode has no group-relative signal)."""
    clean = [t for t in trajs if t.fault is None]
    per_group: dict[str, int] = {}
    for t in clean:
        per_group[t.group_id] = per_group.get(t.group_id, 0) + 1
    return [t for t in clean if per_group[t.group_id] >= 2]
