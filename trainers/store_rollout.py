"""``StoreRollout``: SEED (or GRPO) on sessions a deployed agent already played.

``seed-agents train --from-store URL`` trains on the traffic the capture gateway (or a
``StoreSink``) recorded instead of playing new episodes: a "task" is a task key, and its
GRPO group is the rewarded, unconsumed sessions that share that key. Per iteration:

1. claim up to G sessions per task key for this update (``TraceStore.claim_sessions``:
   exactly once, so no session is ever trained twice, even by two trainers at once);
2. read them back as ``Trajectory`` records (token ids and logprobs exactly as served;
   the reward from the store's ``RewardPolicy``);
3. with ``skills: self``, the policy writes each session's hindsight skill (greedy, the
   stage-1 prompt; the same ``write_skill`` as the in-graph hindsight node), stored with
   the session;
4. rows, teacher prompts and metrics as ``GraphRollout.build`` makes them.

A killed run that resumes replays the same iteration: the sessions already claimed by
that iteration's update id are taken again, never new ones.

Off-policy note: stored sessions were sampled by whatever version served them, so the
PPO ratio's ``old_logprobs`` are the serving version's, and the clip bounds how far one
update follows sessions from older versions. Train soon after serving, or with LoRA from
the served weights, to keep that gap small.
"""

from __future__ import annotations

from typing import Any

from seed_agents.aio import run_sync
from seed_agents.capture import JsonlSink
from seed_agents.skills import SkillInjector, first_user_message
from seed_agents.store import RewardPolicy, SessionRecord, TraceStore
from seed_agents.trainers.rollout import GraphRollout, SkillSource
from seed_agents.trainers.seed_trainer import RolloutBatch
from seed_agents.types import AnswerFormat, SkillFailures, SkillOpening, Task, Trajectory


def store_tasks(store: TraceStore, policy: RewardPolicy, min_sessions: int = 2) -> list[Task]:
    """One task per task key that has at least ``min_sessions`` trainable sessions."""
    per_key: dict[str, int] = {}
    for session in store.trainable_sessions(policy):
        if session.task_key is not None:
            per_key[session.task_key] = per_key.get(session.task_key, 0) + 1
    return [Task(task_id=key, split="store") for key, n in sorted(per_key.items()) if n >= min_sessions]


class StoreRollout(GraphRollout):
    """Implements ``trainers.seed_trainer.Rollout`` over a ``TraceStore``."""

    def __init__(self, store: TraceStore, llm: Any, *, run_id: str, policy: RewardPolicy | None = None,
                 skills: SkillSource = "self", analyzer: Any = None, injector: SkillInjector | None = None,
                 merge_rows: bool = True, skill_max_tokens: int = 256, min_words: int = 5, max_words: int = 120,
                 answer_format: AnswerFormat = "paper", opening: SkillOpening = "words",
                 failures: SkillFailures = "write", out_dir: Any = None) -> None:
        super().__init__(None, llm, skills=skills, injector=injector, merge_rows=merge_rows, out_dir=out_dir)  # type: ignore[arg-type]
        self.store, self.run_id = store, run_id
        self.policy = policy or RewardPolicy()
        self.analyzer = analyzer if analyzer is not None else llm
        self.skill_args = {"max_tokens": skill_max_tokens, "min_words": min_words, "max_words": max_words,
                           "answer_format": answer_format, "opening": opening,
                           "failures": failures}

    def collect(self, tasks: list[Task], group_size: int, iteration: int) -> RolloutBatch:
        update_id = f"{self.run_id}-it{iteration}"
        trajs: list[Trajectory] = []
        for task in tasks:
            for sid in self._claim(task.task_id, group_size, update_id):
                traj = self.store.to_trajectory(sid, self.policy)
                traj.group_id, traj.metadata["iteration"] = f"it{iteration}-{task.task_id}", iteration
                trajs.append(traj)
        if self.skills != "none":
            run_sync(self._write_skills_for(trajs))
        if self.out_dir is not None:
            with JsonlSink(self.out_dir / "trajectories.jsonl") as sink:
                for t in trajs:
                    sink.write("trajectory", t)
        return self.build(trajs, iteration)

    def _claim(self, task_key: str, group_size: int, update_id: str) -> list[str]:
        """This update's sessions of ``task_key``: those it already claimed (a resumed
        iteration), else up to ``group_size`` newly claimed ones, oldest first."""
        mine = [s.session_id for s in self.store.sessions(task_key=task_key, consumed=True) if s.consumed_by == update_id]
        if mine:
            return mine
        free: list[SessionRecord] = [s for s in self.store.trainable_sessions(self.policy) if s.task_key == task_key]
        return self.store.claim_sessions([s.session_id for s in free[:group_size]], update_id)

    async def _write_skills_for(self, trajs: list[Trajectory]) -> None:
        from seed_agents.graphs.hindsight import write_skill  # the in-graph hindsight node's own function

        for traj in trajs:
            if traj.skill is not None:  # written by the agent's own hindsight node when it ran
                continue
            policy_calls = traj.policy_calls
            task_text = first_user_message(policy_calls)
            traj.skill = await write_skill(self.analyzer, policy_calls, task_text, traj.success,
                                           trajectory_id=traj.trajectory_id, task_id=traj.task_id, **self.skill_args)
            self.store.add_skill(str(traj.metadata.get("session_id", traj.trajectory_id)), traj.skill)
