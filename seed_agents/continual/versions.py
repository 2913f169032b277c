"""Model versions of a deployed agent: which one serves, and every decision that moved it.

Agents keep calling one model name; the registry says which trained version (a LoRA
adapter loaded into vLLM under its own served name) that name means right now. The
statuses, and who moves a version between them:

    candidate --gate promote / operator promote--> promoted --next promotion--> retired
        |                                              |
        +--gate reject / recovery discard--> rejected  <--rollback--+

Promises (the store enforces them; this module chooses the transitions):

- A worse candidate never serves: only a ``promoted`` version is ever resolved, and the
  gate path promotes only on a ``promote`` verdict against the version it was compared
  with (compare-and-swap: if another decision moved the pointer since, nothing happens).
- A switch is atomic: the old version is retired, the new one promoted and the decision
  stored in ONE transaction. A process killed before it leaves the candidate a
  candidate (never served, listed by ``pending`` for the restarted loop to decide).
- Exactly one promoted version per name, also under concurrent promoters (row locks,
  and a unique index in the database itself).
- Every decision is stored with its evidence (the gate's ``GateDecision``, an
  operator's reason) and read back with ``decisions``; a gate decision also with every
  canary episode it rests on (``canary.CanaryEpisode``, read back with ``canary_episodes``).
- A drill (``record_drill``: the gate rehearsed on a deliberately regressed candidate)
  never moves the promoted version, whatever the gate said: the drill's candidate is
  rejected and the decision stored with action ``drill``.

Rollback re-promotes the version that the current one replaced when it was promoted
(skipping versions rejected since), and marks the rolled-back version ``rejected``:
evidence from production says it is worse, so no later rollback returns to it. A second
rollback goes one step further back.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict

from seed_agents.continual.canary import CanaryEpisode
from seed_agents.continual.gate import GateDecision
from seed_agents.store import CanaryEpisodeRecord, DecisionRecord, ModelVersionRecord, StoreError, TraceStore

__all__ = ["DecisionRecord", "ServedVersion", "VersionRegistry", "VersionStatus", "served_name_of"]


class VersionStatus(str, Enum):
    CANDIDATE = "candidate"  # trained and maybe loaded; never served
    PROMOTED = "promoted"  # what the model name means now: exactly one per name
    REJECTED = "rejected"  # the gate, a recovery or a rollback said no; never promoted again except by an operator
    RETIRED = "retired"  # served before; a rollback may bring it back


class ServedVersion(BaseModel):
    """What a model name resolves to: the name to send upstream and the version to stamp."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: int
    served_name: str
    path: str = ""  # the adapter folder ("" for the base model): a replica that lacks it loads it from here


def served_name_of(record: ModelVersionRecord) -> str:
    """The name vLLM serves a version under: ``metadata["served_name"]``, else ``{name}-v{version}``
    (what ``trainers.weight_sync.LoRASync`` loads adapters as)."""
    return str(record.metadata.get("served_name") or f"{record.name}-v{record.version}")


_C, _P, _R, _T = (s.value for s in VersionStatus)
_OVERRIDABLE = (_C, _R, _T)  # an operator may promote any version that does not serve


class VersionRegistry:
    """Versions of model names in a ``TraceStore``; safe to share between threads and processes."""

    def __init__(self, store: TraceStore) -> None:
        self.store = store

    # ------------------------------------------------------------------------ reading

    def resolve(self, name: str) -> ServedVersion | None:
        """What ``name`` serves now (the gateway calls this); None before any promotion."""
        record = self.store.promoted_version(name)
        return None if record is None else ServedVersion(name=name, version=record.version,
                                                         served_name=served_name_of(record), path=record.path)

    def versions(self, name: str, status: VersionStatus | str | None = None) -> list[ModelVersionRecord]:
        """Versions of ``name`` by number, optionally of one status."""
        return self.store.model_versions(name, status=None if status is None else VersionStatus(status).value)

    def pending(self, name: str) -> list[ModelVersionRecord]:
        """Candidates with no decision yet, e.g. left by a loop killed before its gate ran."""
        return self.versions(name, VersionStatus.CANDIDATE)

    def decisions(self, name: str, *, limit: int | None = None) -> list[DecisionRecord]:
        """Decisions about ``name`` in the order they were made (the last ``limit``)."""
        return self.store.decisions(name, limit=limit)

    def canary_episodes(self, decision_id: int) -> list[CanaryEpisodeRecord]:
        """The canary episodes decision ``decision_id`` rests on (none for a manual one)."""
        return self.store.canary_episodes([decision_id])

    def names(self) -> list[str]:
        """Model names with at least one version."""
        return sorted({v.name for v in self.store.model_versions()})

    # ------------------------------------------------------------------------ writing

    def add_candidate(self, name: str, path: str, *, served_name: str | None = None, version: int | None = None,
                      metadata: dict[str, Any] | None = None) -> ModelVersionRecord:
        """Record trained weights (an adapter folder) as a candidate: stored, never served.
        ``served_name`` is the name the adapter is loaded under (default ``{name}-v{version}``)."""
        extra = {"served_name": served_name} if served_name else {}
        return self.store.add_model_version(name, path, version=version, status=_C,
                                            metadata={**(metadata or {}), **extra})

    def bootstrap(self, name: str, served_name: str, *, path: str = "", version: int = 0) -> ServedVersion:
        """Make the base model version ``version`` (default 0) of ``name`` the promoted one, if
        nothing is promoted yet; otherwise change nothing. Returns what ``name`` resolves to.
        Idempotent and safe when two processes start at once."""
        found = self.resolve(name)
        if found is not None:
            return found
        if not self._has(name, version):
            try:
                self.store.add_model_version(name, path, version=version, status=_C,
                                             metadata={"served_name": served_name, "base": True})
            except StoreError:
                if not self._has(name, version):  # not a concurrent bootstrap's insert: a real error
                    raise
        try:
            self.store.switch_promoted(name, version, action="promote", actor="bootstrap", expect_current=None,
                                       allow_from=(_C,), evidence={"served_name": served_name},
                                       summary=f"bootstrap: v{version} ({served_name}) serves {name!r}")
        except StoreError:
            found = self.resolve(name)  # a concurrent bootstrap (or promotion) came first: fine
            if found is None:
                raise
            return found
        resolved = self.resolve(name)
        assert resolved is not None
        return resolved

    def _has(self, name: str, version: int) -> bool:
        return any(v.version == version for v in self.versions(name))

    def record_decision(self, name: str, version: int, decision: GateDecision, *, baseline: int,
                        canary: Sequence[CanaryEpisode] = ()) -> DecisionRecord:
        """Apply the gate's verdict on candidate ``version``, compared against ``baseline``.

        ``promote``: as ``promote``. ``reject`` or ``inconclusive``: the candidate becomes
        ``rejected`` (a candidate that cannot be shown safe does not serve; the loop trains
        the next one from the promoted version) and the evidence is stored, with the
        ``canary`` episodes the verdict rests on.
        """
        if decision.promote:
            return self.promote(name, version, decision, baseline=baseline, canary=canary)
        return self.store.decide_version(name, version, _R, action="reject", actor="gate", allow_from=(_C,),
                                         evidence={"baseline": baseline, "gate": decision.model_dump(mode="json")},
                                         summary=f"gate: v{version} vs v{baseline}: {decision.summary()}",
                                         canary=_rows(canary))

    def record_drill(self, name: str, version: int, decision: GateDecision, *, baseline: int,
                     canary: Sequence[CanaryEpisode] = (), how: dict[str, Any] | None = None) -> DecisionRecord:
        """Store a drill: the gate's verdict on ``version``, a deliberately regressed candidate,
        against ``baseline``. Whatever the verdict, ``version`` becomes ``rejected`` and the
        promoted version does not move; the decision's action is ``drill``, its evidence says
        how the candidate was regressed (``how``) and whether the gate would have promoted it."""
        missed = "; the gate would have PROMOTED it (a drill never does)" if decision.promote else ""
        return self.store.decide_version(
            name, version, _R, action="drill", actor="drill", allow_from=(_C,), canary=_rows(canary),
            evidence={"baseline": baseline, "gate": decision.model_dump(mode="json"), "drill": how or {},
                      "would_promote": decision.promote},
            summary=f"drill: regressed v{version} vs v{baseline}: {decision.summary()}{missed}")

    def promote(self, name: str, version: int, decision: GateDecision, *, baseline: int,
                canary: Sequence[CanaryEpisode] = ()) -> DecisionRecord:
        """Promote candidate ``version`` on the gate's ``promote`` verdict against ``baseline``.

        One transaction retires ``baseline``, promotes ``version`` and stores the decision.
        Refused (StoreError, nothing changes) when the verdict is not ``promote``, when
        ``version`` is not a candidate, or when ``baseline`` no longer serves.
        """
        if not decision.promote:
            raise StoreError(f"the gate's verdict on {name} v{version} is {decision.verdict!r}, not 'promote'; "
                             f"record it with record_decision")
        return self.store.switch_promoted(name, version, action="promote", actor="gate", expect_current=baseline,
                                          allow_from=(_C,),
                                          evidence={"baseline": baseline, "gate": decision.model_dump(mode="json")},
                                          summary=f"gate: v{version} vs v{baseline}: {decision.summary()}",
                                          canary=_rows(canary))

    def promote_manually(self, name: str, version: int, *, reason: str | None = None,
                         actor: str = "operator") -> DecisionRecord:
        """An operator's override: promote any version that does not serve (candidate,
        rejected or retired), without a gate; stored as a manual decision."""
        return self.store.switch_promoted(name, version, action="promote", actor=actor, allow_from=_OVERRIDABLE,
                                          evidence={"reason": reason, "manual": True},
                                          summary=_with_reason(f"{actor}: promote v{version}", reason))

    def rollback(self, name: str, *, reason: str | None = None, actor: str = "operator") -> DecisionRecord:
        """Re-promote the version the current one replaced; the current one becomes rejected."""
        # Read the history first: the switch is refused if any decision lands after it,
        # so the statuses read next and the target chosen from both are still true then.
        history = self.decisions(name)
        status = {v.version: v.status for v in self.versions(name)}
        current = next((v for v, s in status.items() if s == _P), None)
        if current is None:
            raise StoreError(f"{name!r} has no promoted version to roll back")
        target = _rollback_target(name, current, history, status)
        return self.store.switch_promoted(
            name, target, action="rollback", actor=actor, expect_current=current,
            expect_last_decision=history[-1].decision_id if history else None, allow_from=(_T,),
            demote_to=_R, evidence={"reason": reason, "rolled_back": current},
            summary=_with_reason(f"{actor}: roll back v{current} -> v{target}", reason))

    def discard(self, name: str, version: int, *, reason: str, actor: str = "recovery",
                canary: Sequence[CanaryEpisode] = ()) -> DecisionRecord:
        """Reject a candidate without a gate verdict (e.g. one a killed loop left undecided
        whose canary cannot be resumed); the reason is stored, with any ``canary`` episodes played."""
        return self.store.decide_version(name, version, _R, action="reject", actor=actor, allow_from=(_C,),
                                         evidence={"reason": reason},
                                         summary=_with_reason(f"{actor}: discard v{version}", reason),
                                         canary=_rows(canary))


def _rows(canary: Sequence[CanaryEpisode]) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json") for e in canary]


def _with_reason(summary: str, reason: str | None) -> str:
    return f"{summary}: {reason}" if reason else summary


def _rollback_target(name: str, current: int, history: list[DecisionRecord], status: dict[int, str]) -> int:
    """Walk back the promotions: the version each one replaced, until a retired one."""
    seen, version = {current}, current
    while True:
        forward = next((d for d in reversed(history) if d.action == "promote" and d.to_version == version
                        and d.from_version != version), None)
        if forward is None or forward.from_version is None:
            raise StoreError(f"nothing to roll back to: {name} v{version} replaced no earlier version that could "
                             f"serve again; promote one with `seed-agents versions promote N`")
        version = forward.from_version
        if version in seen:
            raise StoreError(f"nothing to roll back to: every earlier version of {name!r} was rejected; "
                             f"promote one with `seed-agents versions promote N`")
        seen.add(version)
        if status.get(version) == _T:
            return version
