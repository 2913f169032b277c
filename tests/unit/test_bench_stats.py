"""bench/stats.py against answers worked out by hand or published: a wrong interval or
seed count would make a benchmark's conclusion wrong while every run is fine."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from bench import stats


def test_paired_differences_keep_only_common_seeds_in_order():
    assert stats.paired_differences({2: 0.5, 0: 0.25, 7: 1.0}, {0: 0.5, 2: 0.25}) == {2: 0.25, 0: -0.25}


def test_bootstrap_interval_of_a_two_valued_sample_is_the_binomial_quantiles():
    """Ten 0s and ten 1s: a resample's mean is Binomial(20, 1/2) / 20, whose 2.5% and 97.5%
    quantiles are 6/20 and 14/20 (P(X <= 5) = 0.021, P(X <= 6) = 0.058; symmetric above)."""
    assert stats.bootstrap_ci([0.0] * 10 + [1.0] * 10) == pytest.approx((0.3, 0.7))


def test_bootstrap_interval_matches_the_normal_interval_on_a_large_sample():
    x = np.random.default_rng(1).normal(0.2, 1.0, size=400)
    half = 1.959964 * x.std(ddof=0) / math.sqrt(x.size)  # the bootstrap's standard error uses ddof 0
    low, high = stats.bootstrap_ci(list(x), resamples=20_000)
    assert low == pytest.approx(x.mean() - half, abs=0.1 * half)
    assert high == pytest.approx(x.mean() + half, abs=0.1 * half)


def test_bootstrap_is_seeded_and_degenerate_cases_are_explicit():
    xs = [0.1, -0.2, 0.05, 0.3, 0.0, -0.1]
    assert stats.bootstrap_ci(xs, seed=3) == stats.bootstrap_ci(xs, seed=3)
    assert stats.bootstrap_ci(xs, seed=3) != stats.bootstrap_ci(xs, seed=4)
    assert stats.bootstrap_ci([0.25, 0.25, 0.25]) == (0.25, 0.25)
    assert stats.bootstrap_ci([0.5]) is None
    wide, narrow = stats.bootstrap_ci(xs, confidence=0.99), stats.bootstrap_ci(xs, confidence=0.5)
    assert wide[0] < narrow[0] < narrow[1] < wide[1]


@pytest.mark.parametrize("d, pairs", [(0.2, 199), (0.5, 34), (0.8, 15), (1.0, 10)])
def test_samples_for_effect_equals_g_power_for_a_paired_t_test(d, pairs):
    """G*Power 3, 'means: difference from constant (matched pairs)', two-tailed, alpha 0.05,
    power 0.8 (exact noncentral t): 199, 34, 15 and 10 pairs."""
    assert stats.samples_for_effect(d) == pairs


def test_seeds_needed_is_the_hand_computed_formula_on_observed_differences():
    xs = [0.1, 0.2, -0.05]  # mean 0.08333, sd 0.12583: d_z 0.66227
    d = statistics.fmean(xs) / statistics.stdev(xs)
    hand = (1.959964 + 0.841621) ** 2 / d ** 2 + 1.959964 ** 2 / 2  # 17.90 + 1.92 = 19.82
    assert stats.seeds_needed(xs) == math.ceil(hand) == 20
    assert stats.seeds_needed([-x for x in xs]) == 20  # the sign of the effect does not matter
    assert stats.seeds_needed(xs, power=0.9) > 20
    assert stats.seeds_needed([0.1, -0.1]) is None  # nothing to detect
    assert stats.seeds_needed([0.1, 0.1]) == 2 and stats.seeds_needed([0.1]) is None


def test_compare_counts_float_noise_as_a_tie():
    a = {0: 1 / 12 + 2 / 12, 1: 0.5, 2: 0.25}
    b = {0: 3 / 12, 1: 0.25, 2: 0.5, 3: 1.0}  # 1/12 + 2/12 != 3/12 in floats
    p = stats.compare(a, b)
    assert (p.n, p.higher, p.lower, p.equal) == (3, 1, 1, 1)
    assert p.mean == pytest.approx(0.0) and p.sd == pytest.approx(0.25)
    assert p.ci[0] < 0 < p.ci[1] and p.seeds_needed is None
