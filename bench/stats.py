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

Beside the bootstrap, the paired t-test's own interval and p-value, and the exact sign test.
With the three to six seeds a CPU affords, the percentile bootstrap is too narrow: a resampled
mean never leaves the range of the observed differences, so at n = 4 its 95% interval covers
the true mean far less often than 95%. The t interval (mean +- t_{n-1} sd / sqrt(n)) is the
textbook small-sample one (it assumes roughly normal differences); the sign test assumes
nothing but independent seeds, and says how far "every seed above" goes (4 of 4: p = 0.125).

Held-out scores carry a second source of variation besides the seed: the tasks. Every seed
and both methods play the same held-out tasks, so a task that is hard is hard in every run;
``crossed_bootstrap_ci`` resamples seeds and tasks as crossed factors (task indices drawn once
a resample and applied to every drawn seed and to both methods), where resampling tasks
within each seed on its own treats the shared task set as if each seed had drawn fresh tasks
and shrinks the task share of the variance by the number of seeds. This is Owen's (2007)
"pigeonhole" bootstrap for crossed random effects. It is mildly conservative: a row's and a
column's resampled means each carry the seed-by-task interaction again, so its variance holds
that term about three times where the mean's holds it once; the side a reviewer prefers.

A claim picked from many variants needs its p-value read against the variants tried. ``holm``
is Holm's (1979) step-down correction, which controls the family-wise error rate under any
dependence between the comparisons; ``family_claims`` reports each member of a family with its
raw and Holm-adjusted p and the number of variants tried, the untested ones (one seed: no
p-value) counted in that number as comparisons that could not reject.

Hand-written on numpy and the standard library rather than scipy: scipy is not a
dependency of this project, and each function is a few lines (Student's t for whole degrees
of freedom has a closed form, Abramowitz and Stegun 26.7.3-4).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Hashable

import numpy as np


def paired_differences(a: Mapping[Hashable, float], b: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """``a[s] - b[s]`` for every seed ``s`` both have, in ``a``'s order; unpaired seeds are dropped."""
    return {s: a[s] - b[s] for s in a if s in b}


def bootstrap_ci(xs: Sequence[float], *, confidence: float = 0.95, resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``xs``: resample ``len(xs)`` values with
    replacement ``resamples`` times, take the central ``confidence`` share of the means.
    ``None`` for fewer than two values (no spread to resample). The values are sorted first:
    the interval is a property of the values, not of the order their seeds were read in."""
    x = np.sort(np.asarray(xs, dtype=float))
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


def t_within(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with ``df`` (whole) degrees of freedom: the finite series of
    Abramowitz and Stegun 26.7.3 (odd df) and 26.7.4 (even df) in theta = atan(t / sqrt(df))."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2 == 0:  # sin(theta) (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2))
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    if df == 1:
        return 2 * theta / math.pi
    # 2/pi (theta + sin(theta) cos(theta) (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ... up to c^(df-3)))
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


def t_critical(df: int, confidence: float = 0.95) -> float:
    """The t with P(|T| < t) = ``confidence`` at ``df`` degrees of freedom (bisection on
    ``t_within``; 12.706 at df 1, 3.182 at df 3, 1.96 as df grows)."""
    low, high = 0.0, 1.0
    while t_within(high, df) < confidence:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_within(mid, df) < confidence else (low, mid)
    return (low + high) / 2


def paired_t(xs: Sequence[float], *, confidence: float = 0.95) -> tuple[tuple[float, float] | None, float | None]:
    """(the t interval of the mean of ``xs``, the two-sided p-value of a t-test of mean 0).
    ``(None, None)`` for fewer than two values; with no spread the interval is the point and
    p is 0 (or 1 at mean 0)."""
    if len(xs) < 2:
        return None, None
    return t_test(len(xs), statistics.fmean(xs), statistics.stdev(xs), confidence=confidence)


def t_test(n: int, mean: float, sd: float, *, confidence: float = 0.95) -> tuple[tuple[float, float], float]:
    """``paired_t`` from a sample's size, mean and standard deviation (n - 1), as a result
    file written before the test keeps them."""
    if n < 2:
        raise ValueError(f"a t-test needs two values or more, got {n}")
    if sd == 0:
        return (mean, mean), (1.0 if mean == 0 else 0.0)
    se = sd / math.sqrt(n)
    half = t_critical(n - 1, confidence) * se
    return (mean - half, mean + half), 1.0 - t_within(mean / se, n - 1)


def sign_test(higher: int, lower: int) -> float | None:
    """Two-sided exact sign test: the chance of a split at least as one-sided as ``higher``
    against ``lower`` when either is equally likely (ties left out). ``None`` without a pair."""
    n = higher + lower
    if n == 0:
        return None
    tail = sum(math.comb(n, k) for k in range(min(higher, lower) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


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
    t_ci: tuple[float, float] | None = None  # the paired t-test's interval, at ``confidence``
    p_t: float | None = None  # two-sided paired t-test of a mean difference of 0
    p_sign: float | None = None  # two-sided exact sign test over the seeds that differ


def paired_tests(p: Paired | Mapping[str, Any]) -> str:
    """A comparison's two tests in a few words (a ``Paired`` or its stored dict): "t interval
    [a, b], paired t-test p = x, sign test h of m p = y"; "" for fewer than two seeds or a
    dict stored before the tests were."""
    d = asdict(p) if isinstance(p, Paired) else p
    if d.get("t_ci") is None or d.get("p_t") is None or d.get("p_sign") is None:
        return ""
    lo, hi = d["t_ci"]
    return (f"t interval [{lo:+.3f}, {hi:+.3f}], paired t-test p = {d['p_t']:.3f}, "
            f"sign test {max(d['higher'], d['lower'])} of {d['higher'] + d['lower']} p = {d['p_sign']:.3f}")


def compare(a: Mapping[Hashable, float], b: Mapping[Hashable, float], *, confidence: float = 0.95,
            resamples: int = 10_000, seed: int = 0, tie: float = 1e-9) -> Paired:
    """The paired comparison of ``a`` minus ``b`` over their common seeds; differences
    within ``tie`` count as equal (means of k/12 successes differ by float noise)."""
    d = list(paired_differences(a, b).values())
    higher, lower = sum(x > tie for x in d), sum(x < -tie for x in d)
    t_ci, p_t = paired_t(d, confidence=confidence)
    return Paired(n=len(d), mean=statistics.fmean(d) if d else None,
                  sd=statistics.stdev(d) if len(d) > 1 else (0.0 if d else None),
                  ci=bootstrap_ci(d, confidence=confidence, resamples=resamples, seed=seed),
                  confidence=confidence, seeds_needed=seeds_needed(d),
                  higher=higher, lower=lower, equal=sum(abs(x) <= tie for x in d),
                  t_ci=t_ci, p_t=p_t, p_sign=sign_test(higher, lower) if len(d) > 1 else None)


def crossed_bootstrap_ci(a_S_T: Any, b_S_T: Any = None, *, confidence: float = 0.95, resamples: int = 10_000,
                         seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of ``a - b`` over seeds (rows) and tasks
    (columns), the two resampled as crossed factors: a resample draws ``S`` seed indices and
    ``T`` task indices with replacement, the task indices shared by every drawn seed and by both
    methods. ``b_S_T`` None: the interval of ``a``'s own mean. ``None`` with fewer than two
    values. Rows and columns are taken in the order given (the seeded draws depend on it): a
    caller sorts seeds and tasks, so the same runs give the same interval however read.

    A resample's mean is ``sum_s sum_t n_s m_t d[s, t] / (S T)`` with ``n`` and ``m`` the times
    each seed and task was drawn (multinomial counts), computed as one matrix product."""
    d = np.asarray(a_S_T, dtype=float)
    if b_S_T is not None:
        b = np.asarray(b_S_T, dtype=float)
        if b.shape != d.shape:
            raise ValueError(f"both methods need the same seeds x tasks, got {d.shape} and {b.shape}")
        d = d - b
    if d.ndim != 2:
        raise ValueError(f"scores are seeds x tasks, got shape {d.shape}")
    n_seeds, n_tasks = d.shape
    if d.size < 2:
        return None
    rng = np.random.default_rng(seed)
    seeds_R_S = rng.multinomial(n_seeds, np.full(n_seeds, 1.0 / n_seeds), size=resamples)
    tasks_R_T = rng.multinomial(n_tasks, np.full(n_tasks, 1.0 / n_tasks), size=resamples)
    means_R = ((seeds_R_S @ d) * tasks_R_T).sum(axis=1) / (n_seeds * n_tasks)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means_R, [tail, 1.0 - tail])
    return float(low), float(high)


def holm(p_values: Sequence[float], *, family_size: int | None = None) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sort ascending, multiply the
    i-th smallest (from 0) by ``m - i``, carry the running maximum so the adjusted values keep
    the raw order, cap at 1. ``family_size`` (default: the number of p-values) counts members
    that have no p-value as well; they would sort last (p = 1) and so change the others only
    through ``m``. A member is rejected at ``alpha`` when its adjusted p is below it."""
    m = len(p_values) if family_size is None else family_size
    if m < len(p_values):
        raise ValueError(f"a family of {m} cannot hold {len(p_values)} p-values")
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [1.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Claim:
    """One comparison read against the family it was chosen from."""

    name: str
    p: float | None  # the comparison's own two-sided p; None when it could not be tested
    p_holm: float | None  # Holm-adjusted over the family
    variants: int  # comparisons in the family, tested or not: the variants tried


def family_claims(p_by_name: Mapping[str, float | None]) -> dict[str, Claim]:
    """Every member of a family of comparisons with its raw and Holm-adjusted p; members
    whose p is None (too few seeds to test) count among the variants and get no adjusted p."""
    tested = {name: p for name, p in p_by_name.items() if p is not None}
    adjusted = dict(zip(tested, holm(list(tested.values()), family_size=len(p_by_name))))
    return {name: Claim(name, p, adjusted.get(name), len(p_by_name)) for name, p in p_by_name.items()}


def claim_words(c: Claim | None) -> str:
    """A claim's p beside the family it came from: "Holm p 0.020 over 13 variants" ("not
    tested, one of 13 variants" without a p); "" without a claim."""
    if c is None:
        return ""
    if c.p_holm is None:
        return f"not tested, one of {c.variants} variants"
    return f"Holm p {c.p_holm:.3f} over {c.variants} variant{'' if c.variants == 1 else 's'}"
