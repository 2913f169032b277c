"""The promotion gate: may a candidate replace the promoted version?

A candidate serves users only if the canary evaluation shows it is *not worse* than the
version serving now by more than ``margin``, with confidence. This is a one-sided
non-inferiority test, paired over tasks:

1. Both versions play the same canary tasks with the same seeds. Results are paired by
   ``(task_id, seed)``. A faulted episode (``Trajectory.fault``: a crashed tool, a dead
   server) says nothing about the policy, so a pair with a fault on either side is
   dropped, as is a key that only one side has.
2. The task is the unit: per task, ``d_task`` = the mean over its paired seeds of
   ``candidate - promoted`` (reward or success). Seeds of one task are correlated, and
   tasks are what a deployment samples from, so every task weighs the same.
3. ``mean_diff`` = mean of ``d_task``. Its one-sided lower confidence bound comes from a
   percentile bootstrap over tasks: ``resamples`` means of ``n`` tasks drawn with
   replacement by a ``random.Random(seed)``, sorted; the bound is the
   ``floor((1 - confidence) * resamples)``-th smallest (0-based). Same inputs, same
   config: the same decision, bit for bit.
4. Verdict:
   - ``inconclusive`` when fewer than ``min_tasks`` tasks have a pair (e.g. faults ate
     them): never promote on thin evidence;
   - ``reject`` when the candidate faulted on a share of its episodes more than
     ``max_fault_rate_increase`` above the promoted version's (dropping faulted pairs
     must not hide a candidate that breaks its tools or runs out of time), or when the
     lower bound is below ``-margin``;
   - ``inconclusive`` too when ``floor`` is set and both versions scored at most it on
     every paired episode: a canary nobody solves cannot tell a destroyed model from a
     good one;
   - ``promote`` when the lower bound is ``>= -margin`` and, with ``anchor_margin`` set,
     the anchor check below passes.
5. Anchor (``anchor_margin``): each decision compares the candidate with the version it
   would replace, so a chain of candidates each within ``margin`` of the last can slide
   down by up to a margin per cycle (the atlas demo promoted -0.013 then -0.050 under a
   0.1 margin). With ``anchor_margin`` set, the candidate is also paired, the same way,
   with the anchor's canary results (the version the name started from: the caller says
   which) and a candidate whose lower bound against the anchor is below
   ``-anchor_margin`` is rejected; too few anchor pairs is inconclusive. The drift any
   chain of promotions can accumulate is then bounded by ``anchor_margin`` (at the
   gate's confidence, per decision) instead of growing with the number of cycles.

6. Sameness, for reading only (the verdict does not use it): ``identical_pairs`` counts the
   fault-free pairs whose two episodes did the same thing (the results' ``fingerprint``:
   the same tool calls with the same arguments and the same answer), and ``update`` (given
   by the caller) says how many of the update's groups had no reward variance, so taught
   the candidate nothing through their rewards. A candidate whose every pair is identical
   is reported as indistinguishable from the promoted version: a "promote" then changes
   nothing users see.

An exact copy of the promoted weights with zero variance (every ``d_task`` is 0, so the
bootstrap interval is [0, 0]) IS promoted, even at ``margin == 0``: the test asks "not
worse by more than the margin", and 0 >= -0 holds. With real sampling noise the lower
bound of a copy falls below 0, so at ``margin == 0`` a noisy copy is rejected, and a
positive margin is what lets an equally good candidate through. Comparisons allow 1e-9
of float rounding, so a mean of identical values cannot flip a tie.

The percentile bootstrap is slightly optimistic (too narrow) for few tasks; ``min_tasks``
(default 8) is the guard, and a margin of 0 with a confidence of 0.95 is strict.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from seed_agents.types import FaultKind, Trajectory

Verdict = Literal["promote", "reject", "inconclusive"]
_TOLERANCE = 1e-9


class CanaryResult(BaseModel):
    """One canary episode of one version: the unit the gate pairs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    seed: int = Field(description="The episode's seed; the same (task_id, seed) is played by both versions.")
    reward: float
    success: bool = False
    fault: FaultKind | None = Field(None, description="Set when an infrastructure fault ended the episode: never paired.")
    fingerprint: str | None = Field(None, description=(
        "What the episode did (its tool calls and answer, hashed): equal for two episodes that did the same. "
        "None: not known."))

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"a canary reward must be finite, got {v}")
        return v

    @classmethod
    def of(cls, trajectory: Trajectory, *, seed: int | None = None) -> CanaryResult:
        """The result of a runner episode; ``seed`` defaults to its ``sample_index``."""
        return cls(task_id=trajectory.task_id, seed=trajectory.sample_index if seed is None else seed,
                   reward=trajectory.reward, success=trajectory.success, fault=trajectory.fault)


class GateConfig(BaseModel):
    """How strict the gate is. Every field is part of the stored evidence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    margin: float = Field(0.0, ge=0.0, description="How much worse than the promoted version (mean of candidate - promoted, in metric units) the candidate may be.")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="One-sided confidence of the lower bound on the mean paired difference.")
    min_tasks: int = Field(8, ge=2, description="Fewer tasks with a fault-free pair than this: inconclusive, never promoted.")
    metric: Literal["reward", "success"] = Field("reward", description="What is compared: the episode reward or success (0/1).")
    resamples: int = Field(10_000, ge=100, le=1_000_000, description="Bootstrap resamples of the tasks.")
    seed: int = Field(0, description="Seed of the bootstrap's random.Random: the decision is deterministic.")
    max_fault_rate_increase: float = Field(0.1, ge=0.0, le=1.0, description="Reject when the candidate's share of faulted episodes exceeds the promoted version's by more than this.")
    floor: float | None = Field(None, description=(
        "When both versions score at most this on every paired canary episode (e.g. 0: neither solved a "
        "task), the canary is inconclusive and nothing is promoted. None: no such check."))
    anchor_margin: float | None = Field(None, ge=0.0, description=(
        "Also reject a candidate that may be worse than the anchor (the version the name started from) by"
        " more than this, bounding the total drift. None: no anchor check."))


class AnchorCheck(BaseModel):
    """The candidate against the anchor, paired the same way as against the promoted version."""

    model_config = ConfigDict(frozen=True)

    mean_diff: float | None = Field(description="Mean over tasks of (candidate - anchor); None without pairs.")
    ci_low: float | None = Field(description="One-sided lower bound of mean_diff (checked against -anchor_margin).")
    n_tasks: int
    n_pairs: int
    anchor_mean: float | None
    candidate_mean: float | None


class UpdateSignal(BaseModel):
    """The reward signal of the update that made the candidate: its groups (one per replayed
    session), and how many had equal rewards on every replay (zero advantages: no outcome
    gradient)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    groups: int = Field(ge=0, description="Groups the update trained on.")
    flat_groups: int = Field(ge=0, description="Of them, groups whose replays all got the same reward.")

    @property
    def signal_groups(self) -> int:
        """Groups with unequal rewards: the ones the rewards teach through."""
        return self.groups - self.flat_groups


class GateDecision(BaseModel):
    """The gate's verdict with everything it rests on; ``model_dump(mode="json")`` is what the store keeps."""

    verdict: Verdict
    mean_diff: float | None = Field(description="Mean over tasks of (candidate - promoted); None without pairs.")
    ci_low: float | None = Field(description="One-sided lower confidence bound of mean_diff (what the margin is checked against).")
    ci_high: float | None = Field(description="The matching upper quantile, for reading only.")
    n_tasks: int = Field(description="Tasks with at least one fault-free pair.")
    n_pairs: int = Field(description="Fault-free (task, seed) pairs.")
    per_task: dict[str, float] = Field(description="Per task: mean of candidate - promoted over its paired seeds.")
    promoted_mean: float | None = Field(description="The promoted version's mean over tasks, on the paired episodes.")
    candidate_mean: float | None = Field(description="The candidate's mean over tasks, on the paired episodes.")
    faults: dict[str, int] = Field(description="Faulted episodes per side ('promoted', 'candidate').")
    episodes: dict[str, int] = Field(description="Episodes given per side.")
    unmatched: int = Field(description="(task, seed) keys only one side has.")
    reasons: list[str]
    config: GateConfig
    anchor: AnchorCheck | None = Field(None, description="The check against the anchor, when config.anchor_margin is set.")
    identical_pairs: int | None = Field(None, description=(
        "Fault-free pairs whose two episodes did the same (same tool calls and answer); None: no fingerprints given."))
    update: UpdateSignal | None = Field(None, description="The reward signal of the update that made the candidate, when known.")

    @property
    def promote(self) -> bool:
        return self.verdict == "promote"

    @property
    def indistinguishable(self) -> bool:
        """Every fault-free canary pair played the same episode on both sides."""
        return self.identical_pairs is not None and self.n_pairs > 0 and self.identical_pairs == self.n_pairs

    def sameness(self) -> str:
        """How alike the candidate and the promoted version are ("" when nothing is known)."""
        bits = []
        if self.identical_pairs is not None and self.n_pairs:
            bits.append(f"{self.identical_pairs}/{self.n_pairs} canary pairs identical")
        if self.update is not None:
            bits.append(f"{self.update.flat_groups}/{self.update.groups} update groups without reward variance")
        head = "indistinguishable from the promoted version: " if self.indistinguishable else ""
        return head + ", ".join(bits)

    def summary(self) -> str:
        """One line: verdict, difference, bound against the margin, how many tasks."""
        same = f"; {self.sameness()}" if self.sameness() else ""
        if self.mean_diff is None or self.ci_low is None:
            return f"{self.verdict}: no fault-free pairs ({self.reasons[0]}){same}"
        level = f"{self.config.confidence:.0%}"
        anchor = ""
        if self.anchor is not None and self.anchor.mean_diff is not None and self.anchor.ci_low is not None:
            anchor = (f"; vs the anchor {self.anchor.mean_diff:+.3f}, bound {self.anchor.ci_low:+.3f} vs "
                      f"{_neg(self.config.anchor_margin or 0.0)}")
        return (f"{self.verdict}: mean diff {self.mean_diff:+.3f}, {level} lower bound {self.ci_low:+.3f} vs "
                f"{_neg(self.config.margin)} ({self.n_tasks} tasks, {self.n_pairs} pairs){anchor}{same}")


def decide(promoted: Sequence[CanaryResult], candidate: Sequence[CanaryResult],
           config: GateConfig | None = None, *, anchor: Sequence[CanaryResult] | None = None,
           update: UpdateSignal | None = None) -> GateDecision:
    """Pair the two versions' canary results and decide (see the module docstring).

    ``anchor``: the anchor's canary results, required exactly when ``config.anchor_margin``
    is set (pass ``promoted`` again when the anchor is the promoted version). ``update``:
    the reward signal of the update behind the candidate, kept with the decision."""
    config = config or GateConfig()
    if (anchor is None) != (config.anchor_margin is None):
        raise ValueError("anchor results are given exactly when anchor_margin is set: "
                         f"anchor_margin={config.anchor_margin}, anchor results {'missing' if anchor is None else 'given'}")
    cand = _by_key(candidate, "candidate")
    value = (lambda r: float(r.success)) if config.metric == "success" else (lambda r: r.reward)
    main = _Paired.of(_by_key(promoted, "promoted"), cand, value, config)
    n_tasks, per_task = main.n_tasks, main.per_task
    faults = {"promoted": _count_faults(promoted), "candidate": _count_faults(candidate)}
    episodes = {"promoted": len(promoted), "candidate": len(candidate)}
    fault_excess = _rate(faults["candidate"], len(candidate)) - _rate(faults["promoted"], len(promoted))

    reasons: list[str] = []
    faulted_more = fault_excess > config.max_fault_rate_increase + _TOLERANCE
    if faulted_more:
        reasons.append(f"the candidate faulted in {faults['candidate']}/{len(candidate)} episodes against "
                       f"{faults['promoted']}/{len(promoted)}: {fault_excess:.0%} more, above the allowed "
                       f"{config.max_fault_rate_increase:.0%}")
    level = f"{config.confidence:.0%}"
    verdict: Verdict
    at_floor = config.floor is not None and all(max(pair) <= config.floor + _TOLERANCE
                                                 for pairs in main.sides.values() for pair in pairs)
    if n_tasks < config.min_tasks:
        reasons.append(f"only {n_tasks} tasks have a fault-free pair; the gate needs {config.min_tasks}")
        verdict = "reject" if faulted_more else "inconclusive"
    elif at_floor:
        reasons.append(f"both versions scored <= {config.floor:g} on every paired canary episode: this canary "
                       f"cannot show a regression (give it tasks the promoted version can do)")
        verdict = "reject" if faulted_more else "inconclusive"
    elif main.ci_low is not None and main.ci_low + _TOLERANCE >= -config.margin:
        reasons.append(f"the {level} lower bound of the mean paired difference, {main.ci_low:+.4f}, is within the "
                       f"margin (>= {_neg(config.margin)}) over {n_tasks} tasks")
        verdict = "reject" if faulted_more else "promote"
    else:
        reasons.append(f"the {level} lower bound of the mean paired difference, {main.ci_low:+.4f}, is below "
                       f"{_neg(config.margin)}: the candidate may be worse than the margin allows")
        verdict = "reject"

    check = None
    if anchor is not None and config.anchor_margin is not None:
        vs = _Paired.of(_by_key(anchor, "anchor"), cand, value, config)
        check = AnchorCheck(mean_diff=vs.mean_diff, ci_low=vs.ci_low, n_tasks=vs.n_tasks, n_pairs=vs.n_pairs,
                            anchor_mean=vs.base_mean, candidate_mean=vs.cand_mean)
        if vs.n_tasks < config.min_tasks:
            reasons.append(f"only {vs.n_tasks} tasks pair the candidate with the anchor; the gate needs "
                           f"{config.min_tasks}")
            verdict = "inconclusive" if verdict == "promote" else verdict
        elif vs.ci_low is not None and vs.ci_low + _TOLERANCE < -config.anchor_margin:
            reasons.append(f"against the anchor the {level} lower bound is {vs.ci_low:+.4f}, below "
                           f"{_neg(config.anchor_margin)}: promotions have drifted down from where the name started")
            verdict = "reject"
        else:
            reasons.append(f"against the anchor the {level} lower bound is {vs.ci_low:+.4f}, within "
                           f"{_neg(config.anchor_margin)}")
    if main.identical is not None and main.n_pairs and main.identical == main.n_pairs:
        reasons.append(f"in all {main.n_pairs} fault-free pairs the candidate made the same tool calls and gave the "
                       f"same answer as the promoted version: it is indistinguishable from it on this canary")
    if update is not None and update.groups and not update.signal_groups:
        reasons.append(f"none of the update's {update.groups} groups had unequal rewards: its rewards taught nothing")
    return GateDecision(verdict=verdict, mean_diff=main.mean_diff, ci_low=main.ci_low, ci_high=main.ci_high,
                        n_tasks=n_tasks, n_pairs=main.n_pairs, per_task=per_task, promoted_mean=main.base_mean,
                        candidate_mean=main.cand_mean, faults=faults, episodes=episodes, unmatched=main.unmatched,
                        reasons=reasons, config=config, anchor=check, identical_pairs=main.identical, update=update)


@dataclass(frozen=True)
class _Paired:
    """A base version's and the candidate's results paired by (task, seed), faults dropped,
    reduced per task, with the bootstrap bounds of the mean over tasks."""

    per_task: dict[str, float]
    sides: dict[str, list[tuple[float, float]]]  # per task: (base, candidate) of each fault-free pair
    n_pairs: int
    unmatched: int
    identical: int | None = None  # pairs whose episodes did the same; None when a pair lacks a fingerprint
    mean_diff: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    base_mean: float | None = None
    cand_mean: float | None = None

    @property
    def n_tasks(self) -> int:
        return len(self.per_task)

    @classmethod
    def of(cls, base: dict[tuple[str, int], CanaryResult], cand: dict[tuple[str, int], CanaryResult],
           value: Callable[[CanaryResult], float], config: GateConfig) -> _Paired:
        diffs: dict[str, list[float]] = defaultdict(list)
        sides: dict[str, list[tuple[float, float]]] = defaultdict(list)
        identical: int | None = 0
        for key in sorted(base.keys() & cand.keys()):
            b, c = base[key], cand[key]
            if b.fault is None and c.fault is None:
                diffs[key[0]].append(value(c) - value(b))
                sides[key[0]].append((value(b), value(c)))
                if b.fingerprint is None or c.fingerprint is None:
                    identical = None
                elif identical is not None:
                    identical += b.fingerprint == c.fingerprint
        per_task = {task: _mean(d) for task, d in sorted(diffs.items())}
        paired = cls(per_task=per_task, sides=dict(sides), n_pairs=sum(len(d) for d in diffs.values()),
                     unmatched=len(base.keys() ^ cand.keys()), identical=identical)
        if not per_task:
            return paired
        values = list(per_task.values())
        low, high = _bootstrap_bounds(values, config)
        return replace(paired, mean_diff=_mean(values), ci_low=low, ci_high=high,
                       base_mean=_mean([_mean([b for b, _ in s]) for s in sides.values()]),
                       cand_mean=_mean([_mean([c for _, c in s]) for s in sides.values()]))


class GatePower(BaseModel):
    """What a gate of this size can tell apart (``gate_power``); differences are candidate
    minus promoted, in the gate's metric, as true (population) means over tasks."""

    model_config = ConfigDict(frozen=True)

    n_tasks: int
    sd: float = Field(description="Standard deviation of the per-task paired difference assumed.")
    se: float = Field(description="sd / sqrt(n_tasks): the standard error of mean_diff.")
    power: float
    promotes_above: float = Field(description="A candidate this good or better is promoted with probability >= power.")
    rejects_below: float = Field(description="A candidate this bad or worse is rejected with probability >= power.")
    detectable_gain: float = Field(description="The smallest true gain whose lower bound at the gate's confidence "
                                               "clears 0 with probability >= power (a version shown better).")


def gate_power(sd: float, n_tasks: int, config: GateConfig | None = None, *, power: float = 0.8) -> GatePower:
    """The gate's resolution at ``n_tasks`` canary tasks whose paired differences have
    standard deviation ``sd`` (estimate it from past decisions' ``per_task``).

    A normal approximation of the bootstrap bound: ``ci_low ~ mean_diff - z_c * se`` with
    ``z_c`` the normal quantile at ``confidence``, ``se = sd / sqrt(n)``. The gate promotes
    when ``ci_low >= -margin``, so a candidate whose true difference is ``d`` is promoted
    with probability ``Phi((d + margin) / se - z_c)``; solving for ``power`` gives
    ``promotes_above = -margin + (z_c + z_p) * se`` and ``rejects_below = -margin + (z_c -
    z_p) * se``. Between the two the verdict is a coin toss. ``detectable_gain`` is the same
    arithmetic at margin 0 from the other side: ``(z_c + z_p) * se``, the gain a canary of
    this size shows as an improvement. Faults, ``min_tasks`` and ``floor`` are not modelled.
    """
    config = config or GateConfig()
    if n_tasks < 1:
        raise ValueError(f"n_tasks must be >= 1, got {n_tasks}")
    if not math.isfinite(sd) or sd < 0:
        raise ValueError(f"sd must be a finite number >= 0, got {sd}")
    if not 0.5 <= power < 1:
        raise ValueError(f"power must be in [0.5, 1), got {power}")
    normal = NormalDist()
    z_c, z_p = normal.inv_cdf(config.confidence), normal.inv_cdf(power)
    se = sd / math.sqrt(n_tasks)
    return GatePower(n_tasks=n_tasks, sd=sd, se=se, power=power, promotes_above=-config.margin + (z_c + z_p) * se,
                     rejects_below=-config.margin + (z_c - z_p) * se, detectable_gain=(z_c + z_p) * se)


def _by_key(results: Sequence[CanaryResult], side: str) -> dict[tuple[str, int], CanaryResult]:
    out: dict[tuple[str, int], CanaryResult] = {}
    for r in results:
        key = (r.task_id, r.seed)
        if key in out:
            raise ValueError(f"{side} canary results hold task {r.task_id!r} seed {r.seed} twice; "
                             f"each (task, seed) is played once per version")
        out[key] = r
    return out


def _bootstrap_bounds(values: list[float], config: GateConfig) -> tuple[float, float]:
    """Percentile-bootstrap quantiles of the mean at 1 - confidence and at confidence.

    Indices are drawn as ``int(rng.random() * n)``: ``random.random`` is the one stream
    Python keeps stable across versions, so a stored decision can be recomputed.
    """
    rng = random.Random(config.seed)
    n, draw = len(values), rng.random
    means = sorted(math.fsum(values[int(draw() * n)] for _ in range(n)) / n for _ in range(config.resamples))
    k = int((1.0 - config.confidence) * config.resamples)
    return means[k], means[config.resamples - 1 - k]


def _neg(margin: float) -> str:
    return "0" if margin == 0 else f"-{margin:g}"


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _count_faults(results: Sequence[CanaryResult]) -> int:
    return sum(r.fault is not None for r in results)


def _rate(count: int, total: int) -> float:
    return count / total if total else 0.0
