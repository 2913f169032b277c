"""Trajectories -> training rows.

A multi-turn agent that keeps its whole history re-sends the previous prompt, the
sampled completion and then new tokens (the tool result or observation). When the next
prompt's token ids extend the previous prompt + completion *exactly*, the calls merge
into one row: the new tokens in between are context, masked out of the loss (mask 0,
old logprob 0.0). Anything else (a history window, a template that rewrites earlier
turns, a re-tokenization that differs from what was sampled, a weight update between
calls) starts a new row, so every sampled token is trained on exactly once and always
with the context it was really sampled in.

A guided opening (``LLMCall.guided``) was steered into a tool call by a prefill that
ends its prompt. Its row moves the prefill into the completion: the prompt is the one the
model was offered, free to choose, and the prefill becomes trained tokens (``loss_mask``
1, ``guide_mask`` 1, old log-prob a 0.0 placeholder the trainer fills with the
pre-update policy's own), so the outcome's advantage teaches the model to open with a
call where it paid, or not to where it did not.
"""

from __future__ import annotations

from seed_agents.types import LLMCall, Row, Trajectory


def _extends(prefix: list[int], ids: list[int]) -> bool:
    return len(ids) >= len(prefix) and ids[: len(prefix)] == prefix


def guided_prefill(call: LLMCall) -> int:
    """How many ids at the end of ``call.prompt_ids`` are a guided opening's prefill
    (trained as guide tokens); 0 for every other call."""
    return call.prefill_len if call.guided else 0


def calls_to_rows(calls: list[LLMCall], trajectory: Trajectory, merge: bool = True) -> list[Row]:
    rows: list[Row] = []
    current: Row | None = None
    for call in calls:
        if not call.complete:  # an abandoned stream: no outcome followed these tokens
            current = None
            continue
        n_guide = guided_prefill(call)
        offered = call.prompt_ids[: len(call.prompt_ids) - n_guide]  # what the model was free to answer
        guide = call.prompt_ids[len(offered):]
        trained = guide + list(call.completion_ids)
        guide_mask = [1] * len(guide) + [0] * len(call.completion_ids)
        old = [0.0] * len(guide) + list(call.logprobs)
        seen = (current.prompt_ids + current.completion_ids) if current is not None else None
        if (
            merge and current is not None and seen is not None
            and call.policy_version == current.policy_version
            and _extends(seen, offered)
        ):
            gap = offered[len(seen):]
            if guide or current.guide_mask:
                current.guide_mask = (current.guide_mask or [0] * len(current.completion_ids)) + [0] * len(gap) + guide_mask
            current.completion_ids += gap + trained
            current.loss_mask += [0] * len(gap) + [1] * len(trained)
            current.old_logprobs += [0.0] * len(gap) + old
            current.call_ids.append(call.call_id)
            continue
        current = Row(
            prompt_ids=list(offered),
            completion_ids=trained,
            loss_mask=[1] * len(trained),
            old_logprobs=old,
            guide_mask=guide_mask if guide else [],
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
