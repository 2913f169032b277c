"""Trajectories -> training rows.

A multi-turn agent that keeps its whole history re-sends the previous prompt, the
sampled completion and then new tokens (the tool result or observation). When the next
prompt's token ids extend the previous prompt + completion *exactly*, the calls merge
into one row: the new tokens in between are context, masked out of the loss (mask 0,
old logprob 0.0). Anything else (a history window, a template that rewrites earlier
turns, a re-tokenization that differs from what was sampled, a weight update between
calls) starts a new row, so every sampled token is trained on exactly once and always
with the context it was really sampled in.
"""

from __future__ import annotations

from seed_agents.types import LLMCall, Row, Trajectory


def _extends(prefix: list[int], ids: list[int]) -> bool:
    return len(ids) >= len(prefix) and ids[: len(prefix)] == prefix


def calls_to_rows(calls: list[LLMCall], trajectory: Trajectory, merge: bool = True) -> list[Row]:
    rows: list[Row] = []
    current: Row | None = None
    for call in calls:
        if not call.complete:  # an abandoned stream: no outcome followed these tokens
            current = None
            continue
        seen = (current.prompt_ids + current.completion_ids) if current is not None else None
        if (
            merge and current is not None and seen is not None
            and call.policy_version == current.policy_version
            and _extends(seen, call.prompt_ids)
        ):
            gap = call.prompt_ids[len(seen):]
            current.completion_ids += gap + call.completion_ids
            current.loss_mask += [0] * len(gap) + [1] * len(call.completion_ids)
            current.old_logprobs += [0.0] * len(gap) + list(call.logprobs)
            current.call_ids.append(call.call_id)
            continue
        current = Row(
            prompt_ids=list(call.prompt_ids),
            completion_ids=list(call.completion_ids),
            loss_mask=[1] * len(call.completion_ids),
            old_logprobs=list(call.logprobs),
            trajectory_id=trajectory.trajectory_id,
            task_id=trajectory.task_id,
            group_id=trajectory.group_id,
            call_ids=[call.call_id],
            policy_version=call.policy_version,
        )
        rows.append(current)
    return rows


def trajectory_to_rows(trajectory: Trajectory, merge: bool = True) -> list[Row]:
    """Rows for the trajectory's *policy* calls (analyzer calls never train the policy
    through RL); ``merge=False`` gives one row per call (step-level)."""
    return calls_to_rows(trajectory.policy_calls, trajectory, merge=merge)
