"""What the trace store hands back, and how several rewards become one.

Every record type of the store lives here: sessions and their episodes, rewards, model
versions and decisions, continual-loop cycles and queue lengths (``SessionRecord`` is defined
in ``seed_agents.types``, because a verifier reads it too, and named here). These are read models:
the store builds them from rows; callers never construct them to write. ``RewardPolicy``
is the one place that decides which reward a session trains on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from seed_agents.errors import StoreError  # noqa: F401 - named here for the store; a UserError, one line in the CLI
from seed_agents.types import FaultKind, StopReason, Trajectory
from seed_agents.types import SessionRecord  # noqa: F401 - named here for the store; defined with the verifier it feeds


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


class GatewayRecord(BaseModel):
    """One gateway writing to the store, as it last reported itself (``TraceStore.beat_gateway``)."""

    name: str = Field(description="The gateway's name among those on this store (its config's ``name``).")
    url: str = Field(description="Where it listens.")
    started_at: float
    seen_at: float = Field(description="Its last report; it reports every few seconds while it runs.")
    state: dict[str, Any] = Field(description="What it serves, its replicas (in or out of rotation, and why), its spool.")


class SessionEpisode(BaseModel):
    """What a runner episode adds to its session (``metadata["episode"]``).

    Not the env agent's ``EpisodeRecord`` (the structured turns an offline analyzer
    reads); this one is what the store keeps of a ``Trajectory`` for its session.

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
    def of(cls, trajectory: Trajectory) -> SessionEpisode:
        return cls(trajectory_id=trajectory.trajectory_id, group_id=trajectory.group_id,
                   sample_index=trajectory.sample_index, split=trajectory.split,
                   stop_reason=trajectory.stop_reason, fault=trajectory.fault, success=trajectory.success,
                   error=trajectory.error, env_metadata=trajectory.metadata)


class DecisionRecord(BaseModel):
    """One stored decision about a model version: what moved, who decided, on what evidence.

    ``seed_agents.continual.versions`` decides; the store writes the row and hands it back.
    """

    decision_id: int
    name: str
    version: int = Field(description="The version decided on: the one rejected, or the one switched to (== to_version).")
    action: str = Field(description="'promote', 'reject', 'rollback', 'retire' or 'drill' (a rehearsal of the gate "
                                    "on a deliberately regressed candidate: never moves the promoted version).")
    actor: str = Field(description="Who decided: 'gate', 'operator', 'bootstrap', 'recovery', 'migration', ...")
    from_version: int | None = Field(description="The promoted version before the decision (None: none was).")
    to_version: int | None = Field(description="The promoted version after it (equal to from_version when nothing moved).")
    summary: str = Field(description="One line for people.")
    evidence: dict[str, Any] = Field(description="What the decision rests on, e.g. the gate's paired canary statistics.")
    created_at: float


class CanaryEpisodeRecord(BaseModel):
    """One canary episode, kept with the decision it was evidence for (read model)."""

    episode_id: int
    decision_id: int
    name: str
    version: int = Field(description="The version that played it.")
    side: str = Field(description="'candidate'; 'promoted': the version it was compared with; 'anchor': the "
                                  "version the gate's anchor check compared it with, when that is another.")
    task_id: str
    seed: int = Field(description="The canary seed: both sides play each (task_id, seed) once.")
    reward: float
    success: bool
    fault: str | None = Field(description="The infrastructure fault that ended it (never paired by the gate), or None.")
    trace: dict[str, Any] = Field(description="What the agent did: ``seed_agents.continual.canary.EpisodeTrace`` "
                                              "(tool calls with results or errors, the final answer), bounded.")
    created_at: float


class CycleRecord(BaseModel):
    """One cycle of the continual loop: its state and what it produced (read model)."""

    cycle_id: int
    name: str = Field(description="The model name the cycle trains a candidate of.")
    state: str = Field(description="'claimed', 'trained', 'loaded', 'decided', 'released' or 'skipped'.")
    base_version: int | None = Field(description="The promoted version the candidate is trained from and compared with.")
    candidate_version: int | None = Field(description="The candidate it registered (from 'trained' on).")
    decision_id: int | None = Field(description="The stored decision on the candidate (state 'decided').")
    attempts: int = Field(description="Processes that worked on it: more than 1 after a crash and a resume.")
    created_at: float
    updated_at: float
    metadata: dict[str, Any]


class QueueLengths(BaseModel):
    """Rewarded sessions by where they are in the continual loop (what a dashboard shows)."""

    unclaimed: int = Field(description="Trainable (ended, rewarded, not consumed, not flagged) and waiting.")
    claimed: int = Field(description="Claimed by a cycle that has not trained yet.")
    trained: int = Field(description="Trained into a candidate (whatever the gate said about it).")
    unusable: int = Field(description="Claimed, then found unusable (e.g. every replay unreplayable); never trained.")


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
