"""Paired comparisons over seeds: the difference, its bootstrap interval, and how many
seeds it would take to tell it from zero.

Two methods run with the same seed share that seed's training tasks and held-out games,
so the comparison is paired: one difference per seed. Three numbers then say what a
table can conclude:

- the mean paired difference;
- a percentile bootstrap confidence interval of that mean (seeded, so the printed
  interval is reproducible); with six seeds it is wide, and that width is the point;
- the seeds a paired two-sided t-test would need to detect the observed mean difference
  at the observed spread (alpha 0.05, power 0.8). Formula: Guenther's (1981) normal
  approximation with its t correction, ``n = ((z_{1-a/2} + z_{power}) / d)^2 + z_{1-a/2}^2 / 2``
  rounded up, with ``d = mean / sd`` (Cohen's d_z, sd with n - 1). It gives G*Power's
  exact noncentral-t answers for d_z 0.2, 0.5, 0.8, 1.0 (199, 34, 15, 10).

Hand-written on numpy and the standard library rather than scipy: scipy is not a
dependency of this project, and each function is a few lines.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Hashable

import numpy as np


def paired_differences(a: Mapping[Hashable, float], b: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """``a[s] - b[s]`` for every seed ``s`` both have, in ``a``'s order; unpaired seeds are dropped."""
    return {s: a[s] - b[s] for s in a if s in b}


def bootstrap_ci(xs: Sequence[float], *, confidence: float = 0.95, resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``xs``: resample ``len(xs)`` values with
    replacement ``resamples`` times, take the central ``confidence`` share of the means.
    ``None`` for fewer than two values (no spread to resample)."""
    x = np.asarray(xs, dtype=float)
    if x.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def seeds_needed(xs: Sequence[float], *, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Seeds (pairs) a two-sided paired t-test needs to detect ``mean(xs)`` at the spread of
    ``xs`` with the given power (Guenther's formula, see the module docstring). ``None``
    when there is nothing to detect (mean 0) or fewer than two values; 2 when the spread is 0."""
    if len(xs) < 2:
        return None
    mean, sd = statistics.fmean(xs), statistics.stdev(xs)
    if abs(mean) < 1e-12:
        return None
    if sd == 0:
        return 2
    return max(2, samples_for_effect(abs(mean) / sd, alpha=alpha, power=power))


def samples_for_effect(d: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """Pairs needed for standardized effect ``d`` (d_z): Guenther's approximation, rounded up."""
    z = statistics.NormalDist()
    za, zb = z.inv_cdf(1 - alpha / 2), z.inv_cdf(power)
    return math.ceil(((za + zb) / d) ** 2 + za ** 2 / 2 - 1e-9)


@dataclass(frozen=True)
class Paired:
    """One paired comparison, ready to print or store."""

    n: int
    mean: float | None
    sd: float | None
    ci: tuple[float, float] | None
    confidence: float
    seeds_needed: int | None
    higher: int
    lower: int
    equal: int


def compare(a: Mapping[Hashable, float], b: Mapping[Hashable, float], *, confidence: float = 0.95,
            resamples: int = 10_000, seed: int = 0, tie: float = 1e-9) -> Paired:
    """The paired comparison of ``a`` minus ``b`` over their common seeds; differences
    within ``tie`` count as equal (means of k/12 successes differ by float noise)."""
    d = list(paired_differences(a, b).values())
    return Paired(n=len(d), mean=statistics.fmean(d) if d else None,
                  sd=statistics.stdev(d) if len(d) > 1 else (0.0 if d else None),
                  ci=bootstrap_ci(d, confidence=confidence, resamples=resamples, seed=seed),
                  confidence=confidence, seeds_needed=seeds_needed(d),
                  higher=sum(x > tie for x in d), lower=sum(x < -tie for x in d),
                  equal=sum(abs(x) <= tie for x in d))
