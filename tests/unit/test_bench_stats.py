"""bench/stats.py against answers worked out by hand or published: a wrong interval or
seed count would make a benchmark's conclusion wrong while every run is fine."""

from __future__ import annotations

import dataclasses
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


@pytest.mark.parametrize("df, t", [(1, 12.706205), (2, 4.302653), (3, 3.182446), (4, 2.776445), (5, 2.570582),
                                   (10, 2.228139), (30, 2.042272)])
def test_t_critical_values_are_the_published_table(df, t):
    """Two-sided 95% critical values of Student's t (any statistics table)."""
    assert stats.t_critical(df) == pytest.approx(t, abs=2e-6)


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 9.0])
def test_t_within_is_the_closed_form_at_one_two_and_three_degrees_of_freedom(t):
    assert stats.t_within(t, 1) == pytest.approx(2 * math.atan(t) / math.pi)  # Cauchy
    assert stats.t_within(t, 2) == pytest.approx(t / math.sqrt(2 + t * t))
    u = t / math.sqrt(3)
    assert stats.t_within(t, 3) == pytest.approx(2 / math.pi * (math.atan(u) + u / (1 + u * u)))
    assert stats.t_within(-t, 5) == stats.t_within(t, 5)  # P(|T| < t): the sign does not matter


def test_t_within_tends_to_the_normal_and_refuses_no_degrees_of_freedom():
    assert stats.t_within(1.959964, 20_000) == pytest.approx(0.95, abs=1e-4)
    with pytest.raises(ValueError):
        stats.t_within(1.0, 0)


def test_paired_t_is_the_hand_computed_test_on_four_seeds():
    xs = [0.2, 0.2875, 0.1875, 0.125]  # the own-skill curve's SEED - GRPO by seed
    mean, sd = statistics.fmean(xs), statistics.stdev(xs)
    se = sd / 2
    (low, high), p = stats.paired_t(xs)
    assert (low, high) == pytest.approx((mean - 3.182446 * se, mean + 3.182446 * se), abs=1e-6)
    assert p == pytest.approx(1 - stats.t_within(mean / se, 3))
    assert 0.005 < p < 0.015  # t = 5.97 on 3 degrees of freedom
    # the bootstrap's interval is narrower than the t interval at this size: the reason for both
    boot = stats.bootstrap_ci(xs)
    assert low < boot[0] and boot[1] < high
    assert stats.paired_t([0.1]) == (None, None)
    assert stats.paired_t([0.1, 0.1]) == ((0.1, 0.1), 0.0) and stats.paired_t([0.0, 0.0])[1] == 1.0


def test_the_t_tests_p_is_five_percent_at_the_critical_value():
    xs = [0.02, -0.02, 0.02, -0.02]
    shifted = [x + 3.182446 * statistics.stdev(xs) / 2 for x in xs]  # the mean at t_crit(3) standard errors
    assert stats.paired_t(shifted)[1] == pytest.approx(0.05, abs=1e-6)
    assert stats.paired_t(shifted)[0][0] == pytest.approx(0.0, abs=1e-6)  # and the interval touches 0


@pytest.mark.parametrize("higher, lower, p", [(4, 0, 0.125), (5, 0, 0.0625), (6, 0, 0.03125), (0, 6, 0.03125),
                                              (3, 1, 0.625), (2, 2, 1.0), (9, 1, 0.021484375)])
def test_sign_test_is_the_exact_binomial(higher, lower, p):
    assert stats.sign_test(higher, lower) == pytest.approx(p)


def test_compare_carries_both_tests_and_says_them():
    p = stats.compare({0: 0.7, 1: 0.8, 2: 0.75, 3: 0.6}, {0: 0.5, 1: 0.55, 2: 0.55, 3: 0.55})
    assert p.p_sign == 0.125 and p.t_ci == pytest.approx(stats.paired_t([0.2, 0.25, 0.2, 0.05])[0])
    words = stats.paired_tests(p)
    assert words.startswith(f"t interval [{p.t_ci[0]:+.3f}, {p.t_ci[1]:+.3f}], paired t-test p = {p.p_t:.3f}")
    assert words.endswith("sign test 4 of 4 p = 0.125")
    assert stats.paired_tests(dataclasses.asdict(p)) == words  # a stored comparison reads the same
    one = stats.compare({0: 0.7}, {0: 0.5})
    assert (one.t_ci, one.p_t, one.p_sign) == (None, None, None) and stats.paired_tests(one) == ""
    assert stats.paired_tests({"mean": 0.1, "ci": [0.0, 0.2], "n": 3}) == ""  # stored before the tests


def test_the_t_test_from_a_stored_summary_is_the_one_on_the_values():
    xs = [0.0, 0.125, 0.0833, 0.0972]  # sample_efficiency's seeds: its file keeps n, mean and sd only
    assert stats.t_test(4, statistics.fmean(xs), statistics.stdev(xs)) == stats.paired_t(xs)
    with pytest.raises(ValueError):
        stats.t_test(1, 0.1, 0.0)


def test_the_bootstrap_interval_does_not_depend_on_the_order_of_the_values():
    # paired differences come in the order their seeds were run or read back (``--seeds 2,0,1``)
    xs = [0.85, 0.475, 0.0875, -0.1, 0.3]
    assert stats.bootstrap_ci(xs, resamples=500) == stats.bootstrap_ci(list(reversed(xs)), resamples=500)


# -- the crossed bootstrap: seeds and tasks resampled as crossed factors ----------------------

def test_crossed_bootstrap_of_identical_methods_is_zero_and_of_a_constant_shift_is_that_shift():
    b = np.random.default_rng(0).integers(0, 2, size=(4, 30)).astype(float)
    assert stats.crossed_bootstrap_ci(b, b) == (0.0, 0.0)
    low, high = stats.crossed_bootstrap_ci(b + 0.25, b)
    assert low == pytest.approx(0.25) and high == pytest.approx(0.25)


def test_crossed_bootstrap_with_one_factor_fixed_is_the_binomial_quantiles():
    """One seed and ten failed and ten solved tasks (or one task over twenty seeds): a
    resample's mean is Binomial(20, 1/2) / 20, 2.5% and 97.5% quantiles 6/20 and 14/20 (as
    bootstrap_ci's case above)."""
    row = [0.0] * 10 + [1.0] * 10
    assert stats.crossed_bootstrap_ci([row]) == pytest.approx((0.3, 0.7))
    assert stats.crossed_bootstrap_ci([[x] for x in row]) == pytest.approx((0.3, 0.7))


def test_crossed_bootstrap_keeps_the_task_variance_that_tasks_resampled_per_seed_divide_by_the_seeds():
    """Every seed scores the same difference on a task (a task is hard or easy in every run):
    the mean's uncertainty is the tasks' alone, 1.96 sd / sqrt(T) either side. Resampling tasks
    independently within each of S seeds averages S independent task means, sqrt(S) narrower."""
    n_seeds, n_tasks = 4, 40
    u = np.random.default_rng(2).normal(0.1, 0.5, size=n_tasks)
    d = np.tile(u, (n_seeds, 1))
    low, high = stats.crossed_bootstrap_ci(d, resamples=20_000)
    half = 1.959964 * u.std(ddof=0) / math.sqrt(n_tasks)
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert (low + high) / 2 == pytest.approx(u.mean(), abs=0.1 * half)
    rng = np.random.default_rng(0)  # the per-seed task resampling, seeds fixed for simplicity
    per_seed = np.array([np.mean([row[rng.integers(0, n_tasks, n_tasks)].mean() for row in d]) for _ in range(5000)])
    independent = np.quantile(per_seed, [0.025, 0.975])
    assert (high - low) / (independent[1] - independent[0]) == pytest.approx(math.sqrt(n_seeds), rel=0.15)


def test_crossed_bootstrap_is_seeded_and_refuses_what_is_not_paired():
    a = np.random.default_rng(3).integers(0, 2, size=(3, 20))
    b = np.random.default_rng(4).integers(0, 2, size=(3, 20))
    assert stats.crossed_bootstrap_ci(a, b, seed=1) == stats.crossed_bootstrap_ci(a, b, seed=1)
    assert stats.crossed_bootstrap_ci(a, b, seed=1) != stats.crossed_bootstrap_ci(a, b, seed=2)
    assert stats.crossed_bootstrap_ci([[0.5]]) is None
    with pytest.raises(ValueError):
        stats.crossed_bootstrap_ci(a, b[:, :10])
    with pytest.raises(ValueError):
        stats.crossed_bootstrap_ci([0.1, 0.2, 0.3])


# -- Holm's correction over a family of comparisons -------------------------------------------

def test_holm_by_hand():
    """Sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (the
    running maximum keeps the raw order); returned in the order given."""
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # two more members without a p-value: m = 6; 0.005 x 6, 0.01 x 5, 0.03 x 4, 0.04 x 3 = 0.12
    assert stats.holm([0.01, 0.04, 0.03, 0.005], family_size=6) == pytest.approx([0.05, 0.12, 0.12, 0.03])
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0]  # 0.5 x 2 = 1.0 capped, carried to 0.6
    assert stats.holm([]) == []
    with pytest.raises(ValueError):
        stats.holm([0.1, 0.2], family_size=1)


def test_a_claim_is_read_against_every_variant_tried():
    """Thirteen variants, three of them not testable (one seed): the best raw p 0.0015 x 13 =
    0.0195 survives at 5%; 0.022 x 12 = 0.264 and 0.034 x 11 = 0.374 do not."""
    family = {"own": 0.0015, "imitate": 0.022, "generic": 0.034, "oracle": 0.13, "rule": 0.25, "u30": 0.17,
              "episode": 0.55, "fixed": 0.42, "retired": 0.038, "first": 0.667,
              "one-a": None, "one-b": None, "one-c": None}
    claims = stats.family_claims(family)
    assert {c.variants for c in claims.values()} == {13}
    assert claims["own"].p_holm == pytest.approx(0.0195)
    assert claims["imitate"].p_holm == pytest.approx(0.264) and claims["generic"].p_holm == pytest.approx(0.374)
    assert claims["retired"].p_holm == pytest.approx(0.38)  # 0.038 x 10, after 0.034
    assert [n for n, c in claims.items() if c.p_holm is not None and c.p_holm < 0.05] == ["own"]
    assert claims["one-a"].p_holm is None and claims["one-a"].p is None
    assert stats.claim_words(claims["own"]) == f"Holm p {0.0015 * 13:.3f} over 13 variants"
    assert stats.claim_words(claims["one-a"]) == "not tested, one of 13 variants"
    assert stats.claim_words(None) == ""
