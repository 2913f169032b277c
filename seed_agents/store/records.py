"""What the trace store hands back, and how several rewards become one.

These are read models: the store builds them from rows; callers never construct them to
write. ``RewardPolicy`` is the one place that decides which reward a session trains on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from seed_agents.types import FaultKind, StopReason, Trajectory


class StoreError(RuntimeError):
    """A store request that cannot be done; the message says what to fix."""


class SessionRecord(BaseModel):
    """One session: the calls of one conversation or episode, and its life cycle."""

    session_id: str
    task_key: str | None = Field(description="Sessions with the same task key form one GRPO group.")
    created_at: float
    ended_at: float | None = Field(description="None while the session may still receive calls.")
    metadata: dict[str, Any]
    flagged_reason: str | None = Field(description="Why the session must never be trained on (e.g. a secret seen).")
    consumed_by: str | None = Field(description="The update that trained on it; a session is trained at most once.")
    num_calls: int


class RewardRecord(BaseModel):
    """One reward as it arrived; a session may collect several from different sources."""

    reward_id: int
    session_id: str
    value: float
    source: str = Field(description="Who gave it: 'verifier', 'user', 'judge', 'env', ...")
    turn: int | None = Field(description="The call (seq) it is about; None for the whole session.")
    comment: str | None
    created_at: float


class ModelVersionRecord(BaseModel):
    """One trained model version (full folder or LoRA adapter) and the loop's verdict on it."""

    name: str
    version: int
    path: str = Field(description="Folder of the weights or of the LoRA adapter.")
    status: str = Field(description="'candidate', 'promoted', 'rejected', ... (the loop's vocabulary).")
    created_at: float
    updated_at: float
    metadata: dict[str, Any]


class EpisodeRecord(BaseModel):
    """What a runner episode adds to its session (``metadata["episode"]``).

    Kept so that ``to_trajectory`` gives a faulted episode back its fault: a file-based
    trainer reading an export then skips it, as the store's own selection does.
    """

    trajectory_id: str
    group_id: str
    sample_index: int = 0
    split: str = "train"
    stop_reason: StopReason = StopReason.DONE
    fault: FaultKind | None = None
    success: bool = False
    error: str | None = None
    env_metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, trajectory: Trajectory) -> EpisodeRecord:
        return cls(trajectory_id=trajectory.trajectory_id, group_id=trajectory.group_id,
                   sample_index=trajectory.sample_index, split=trajectory.split,
                   stop_reason=trajectory.stop_reason, fault=trajectory.fault, success=trajectory.success,
                   error=trajectory.error, env_metadata=trajectory.metadata)


class RewardPolicy(BaseModel):
    """Which of a session's rewards counts, when several sources scored it.

    The rewards of the highest-precedence source present are taken; sources not listed
    rank after the listed ones, in the order their first reward arrived. Within that
    source, ``combine`` picks the first, the mean or the last value in arrival order.
    A verifier outranks a user by default because it checks the outcome; a judge, which
    only compares sessions, ranks last. ``turn`` is kept with each reward but does not
    change the session's reward.
    """

    precedence: list[str] = Field(default_factory=lambda: ["verifier", "user", "judge"],
                                  description="Sources, most trusted first.")
    combine: Literal["first", "mean", "last"] = Field("first", description="How to merge one source's rewards.")
    ignore_unlisted: bool = Field(False, description="Count only sources named in precedence (e.g. train on verifier rewards only).")

    def counts(self, source: str) -> bool:
        """Whether a reward from ``source`` may decide a session's reward."""
        return not self.ignore_unlisted or source in self.precedence

    def resolve(self, rewards: Sequence[RewardRecord]) -> float | None:
        """The session's reward from its rewards in arrival order; None when none counts."""
        by_source: dict[str, list[float]] = {}
        for r in rewards:
            if self.counts(r.source):
                by_source.setdefault(r.source, []).append(r.value)
        if not by_source:
            return None
        arrival = list(by_source)
        best = min(arrival, key=lambda s: (self.precedence.index(s) if s in self.precedence else len(self.precedence),
                                           arrival.index(s)))
        values = by_source[best]
        if self.combine == "first":
            return values[0]
        if self.combine == "last":
            return values[-1]
        return sum(values) / len(values)
