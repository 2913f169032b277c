"""The promotion gate on hand-built canary results: pairing, faults, the bootstrap bound, the verdict."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import ValidationError

from seed_agents.continual.gate import CanaryResult, GateConfig, GateDecision, decide
from seed_agents.types import FaultKind, Trajectory


def results(rewards: dict[str, list[float]], faults: dict[tuple[str, int], FaultKind] | None = None) -> list[CanaryResult]:
    """One result per (task, seed) from ``{task: [reward of seed 0, seed 1, ...]}``."""
    faults = faults or {}
    return [CanaryResult(task_id=task, seed=seed, reward=r, success=r >= 1.0, fault=faults.get((task, seed)))
            for task, rs in rewards.items() for seed, r in enumerate(rs)]


def tasks(n: int, rewards: list[float]) -> dict[str, list[float]]:
    return {f"t{i:02d}": list(rewards) for i in range(n)}


def test_a_clear_regression_is_rejected():
    promoted = results(tasks(10, [1.0, 1.0]))
    candidate = results({f"t{i:02d}": [1.0, 0.0] if i % 2 else [0.0, 0.0] for i in range(10)})
    d = decide(promoted, candidate, GateConfig(margin=0.1))
    assert d.verdict == "reject" and not d.promote
    assert d.mean_diff == pytest.approx(-0.75) and d.ci_low is not None and d.ci_low < -0.1
    assert (d.n_tasks, d.n_pairs, d.promoted_mean, d.candidate_mean) == (10, 20, 1.0, 0.25)
    assert "below -0.1" in d.reasons[-1]


def test_an_exact_copy_with_zero_variance_is_promoted_even_at_margin_zero():
    """The chosen behaviour: every paired difference is 0, the interval is [0, 0], and
    "not worse by more than 0" holds (0 >= -0), so the copy is promoted."""
    promoted = results({f"t{i:02d}": [float(i % 2), 0.5, 1.0] for i in range(8)})
    d = decide(promoted, promoted, GateConfig(margin=0.0))
    assert d.verdict == "promote"
    assert (d.mean_diff, d.ci_low, d.ci_high) == (0.0, 0.0, 0.0)
    assert set(d.per_task.values()) == {0.0}


def test_a_noisy_copy_is_rejected_at_margin_zero_and_promoted_when_the_margin_allows():
    """Equally good on average (mean difference 0) but noisy per task: the lower bound is
    below 0, so margin 0 rejects it and a margin wider than the noise promotes it."""
    promoted = results(tasks(20, [0.5]))
    candidate = results({f"t{i:02d}": [1.0 if i % 2 else 0.0] for i in range(20)})  # diffs +-0.5
    strict = decide(promoted, candidate, GateConfig(margin=0.0))
    assert strict.mean_diff == 0.0 and strict.ci_low is not None and -0.3 < strict.ci_low < 0
    assert strict.verdict == "reject"
    lenient = decide(promoted, candidate, GateConfig(margin=0.3))
    assert lenient.verdict == "promote" and lenient.ci_low == strict.ci_low


def test_the_bound_is_the_bootstrap_quantile():
    """Two tasks with differences 0 and 1: a resampled mean is 0, 0.5 or 1 with
    probability 1/4, 1/2, 1/4. The 30% quantile is therefore 0.5, the 20% one is 0."""
    promoted = results({"a": [0.0], "b": [0.0]})
    candidate = results({"a": [0.0], "b": [1.0]})
    at_70 = decide(promoted, candidate, GateConfig(confidence=0.7, min_tasks=2))
    assert (at_70.mean_diff, at_70.ci_low, at_70.ci_high) == (0.5, 0.5, 0.5)
    at_80 = decide(promoted, candidate, GateConfig(confidence=0.8, min_tasks=2))
    assert (at_80.ci_low, at_80.ci_high) == (0.0, 1.0)


def test_the_task_is_the_unit_seeds_are_averaged_within_it():
    promoted = results({"a": [0.0, 0.0, 0.0, 0.0], "b": [1.0]})
    candidate = results({"a": [1.0, 0.0, 0.0, 0.0], "b": [0.0]})
    d = decide(promoted, candidate, GateConfig(min_tasks=2))
    assert d.per_task == {"a": 0.25, "b": -1.0}
    assert d.mean_diff == pytest.approx(-0.375)  # not (1 - 1) / 5 over pooled seeds
    assert (d.n_tasks, d.n_pairs) == (2, 5)


def test_faulted_and_unmatched_episodes_are_dropped_from_the_pairing():
    promoted = results(tasks(8, [1.0, 1.0]), faults={("t00", 0): FaultKind.BACKEND})
    # the candidate "fails" exactly where the promoted version faulted, and has a faulted
    # episode of its own: neither may count against it
    candidate = results({**tasks(8, [1.0, 1.0]), "t00": [0.0, 1.0], "extra": [0.0]},
                        faults={("t03", 1): FaultKind.TIMEOUT})
    d = decide(promoted, candidate, GateConfig(max_fault_rate_increase=0.5))
    assert d.verdict == "promote" and set(d.per_task.values()) == {0.0}
    assert "extra" not in d.per_task and d.unmatched == 1
    assert (d.n_tasks, d.n_pairs) == (8, 14)
    assert d.faults == {"promoted": 1, "candidate": 1} and d.episodes == {"promoted": 16, "candidate": 17}


def test_too_few_pairs_is_inconclusive_never_promote():
    faults = {(f"t{i:02d}", s): FaultKind.ENV for i in range(4) for s in range(2)}
    promoted = results(tasks(8, [1.0, 1.0]), faults=faults)
    candidate = results(tasks(8, [1.0, 1.0]), faults=faults)
    d = decide(promoted, candidate, GateConfig(min_tasks=8))
    assert d.verdict == "inconclusive" and not d.promote
    assert d.n_tasks == 4 and "only 4 tasks" in d.reasons[-1]
    nothing = decide([], [], GateConfig())
    assert nothing.verdict == "inconclusive" and nothing.mean_diff is None and nothing.ci_low is None
    assert "no fault-free pairs" in nothing.summary()


def test_a_candidate_that_faults_more_is_rejected_even_if_its_pairs_look_fine():
    promoted = results(tasks(10, [1.0, 1.0]))
    faults = {(f"t{i:02d}", 1): FaultKind.TIMEOUT for i in range(5)}  # 25% of its episodes time out
    candidate = results(tasks(10, [1.0, 1.0]), faults=faults)
    d = decide(promoted, candidate, GateConfig(max_fault_rate_increase=0.1))
    assert d.verdict == "reject" and "faulted in 5/20 episodes against 0/20" in d.reasons[0]
    assert decide(promoted, candidate, GateConfig(max_fault_rate_increase=0.3)).verdict == "promote"


def test_success_metric_compares_success_not_reward():
    promoted = results(tasks(8, [0.2]))  # reward 0.2, not a success
    candidate = results(tasks(8, [0.9]))  # reward up, still not a success
    assert decide(promoted, candidate, GateConfig(metric="success")).mean_diff == 0.0
    assert decide(promoted, candidate, GateConfig(metric="reward")).mean_diff == pytest.approx(0.7)


def test_the_bootstrap_is_deterministic_and_order_free():
    rng = random.Random(3)
    promoted = results({f"t{i:02d}": [rng.random() for _ in range(3)] for i in range(12)})
    candidate = results({f"t{i:02d}": [rng.random() for _ in range(3)] for i in range(12)})
    first = decide(promoted, candidate)
    shuffled_p, shuffled_c = promoted[:], candidate[:]
    random.Random(9).shuffle(shuffled_p)
    random.Random(10).shuffle(shuffled_c)
    assert decide(shuffled_p, shuffled_c) == first
    assert decide(promoted, candidate) == first
    other_seed = decide(promoted, candidate, GateConfig(seed=1))
    assert other_seed.ci_low != first.ci_low and other_seed.mean_diff == first.mean_diff


def test_the_decision_serializes_to_json_and_back():
    d = decide(results(tasks(8, [1.0, 0.0])), results(tasks(8, [0.0, 1.0])), GateConfig(margin=0.05))
    stored = json.loads(json.dumps(d.model_dump(mode="json")))
    assert GateDecision.model_validate(stored) == d
    assert stored["config"]["margin"] == 0.05 and stored["verdict"] == d.verdict
    assert d.summary().startswith(f"{d.verdict}: mean diff +0.000, 95% lower bound")


def test_bad_inputs_are_refused():
    dup = [CanaryResult(task_id="a", seed=0, reward=1.0)] * 2
    with pytest.raises(ValueError, match="task 'a' seed 0 twice"):
        decide(dup, dup)
    with pytest.raises(ValidationError, match="finite"):
        CanaryResult(task_id="a", seed=0, reward=float("nan"))
    with pytest.raises(ValidationError):
        GateConfig(margin=-0.1)
    with pytest.raises(ValidationError):
        GateConfig(confidence=1.0)


def test_canary_result_of_a_trajectory():
    t = Trajectory(task_id="game-3", group_id="g", sample_index=2, reward=10.0, success=True, fault=None)
    assert CanaryResult.of(t) == CanaryResult(task_id="game-3", seed=2, reward=10.0, success=True)
    faulted = Trajectory(task_id="game-3", group_id="g", reward=0.0, fault=FaultKind.BACKEND)
    assert CanaryResult.of(faulted, seed=7).fault is FaultKind.BACKEND and CanaryResult.of(faulted, seed=7).seed == 7


def test_a_canary_nobody_solves_is_inconclusive_with_a_floor():
    """0 vs 0 everywhere is 'not worse' without a floor; with floor 0 it cannot show a
    regression, so it is never promoted; one task the candidate solves is evidence again."""
    zeros = tasks(8, [0.0, 0.0])
    assert decide(results(zeros), results(zeros), GateConfig(margin=0.1)).verdict == "promote"
    at_floor = decide(results(zeros), results(zeros), GateConfig(margin=0.1, floor=0.0))
    assert at_floor.verdict == "inconclusive" and "cannot show a regression" in at_floor.reasons[-1]
    better = {**zeros, "t00": [1.0, 1.0]}
    assert decide(results(zeros), results(better), GateConfig(margin=0.1, floor=0.0)).verdict == "promote"


# ---------------------------------------------------------------- gate_power


def test_gate_power_numbers_follow_the_normal_approximation():
    from seed_agents.continual.gate import gate_power

    p = gate_power(0.5, 100, GateConfig(margin=0.1, confidence=0.9), power=0.8)
    assert p.se == pytest.approx(0.05)
    assert p.promotes_above == pytest.approx(-0.1 + (1.281552 + 0.841621) * 0.05, abs=1e-6)
    assert p.rejects_below == pytest.approx(-0.1 + (1.281552 - 0.841621) * 0.05, abs=1e-6)
    assert p.detectable_gain == pytest.approx((1.281552 + 0.841621) * 0.05, abs=1e-6)
    # four times the tasks halve every distance from -margin
    q = gate_power(0.5, 400, GateConfig(margin=0.1, confidence=0.9), power=0.8)
    assert q.promotes_above + 0.1 == pytest.approx((p.promotes_above + 0.1) / 2)
    with pytest.raises(ValueError, match="n_tasks"):
        gate_power(0.5, 0)
    with pytest.raises(ValueError, match="sd"):
        gate_power(float("nan"), 10)
    with pytest.raises(ValueError, match="power"):
        gate_power(0.5, 10, power=1.0)


@pytest.mark.parametrize("where, expected", [("promotes_above", 0.8), ("rejects_below", 0.2)])
def test_gate_power_predicts_how_often_the_real_gate_promotes(where: str, expected: float):
    """Canaries simulated at the predicted boundary: paired differences in {-1, 0, +1} with
    the assumed sd, decided by ``decide`` itself (its bootstrap, not the formula)."""
    from seed_agents.continual.gate import gate_power

    config = GateConfig(margin=0.1, confidence=0.9, resamples=400, min_tasks=4)
    sd, n = 0.5, 80
    d = getattr(gate_power(sd, n, config, power=0.8), where)
    up = (sd**2 + d**2 + d) / 2  # P(+1) - P(-1) = d and P(+1) + P(-1) = sd^2 + d^2
    down = up - d
    rng = random.Random(7)
    sims, promoted = 300, 0
    for _ in range(sims):
        cand = {}
        for i in range(n):
            u = rng.random()
            cand[f"t{i:02d}"] = [1.0 if u < up else -1.0 if u < up + down else 0.0]
        base = results({t: [0.0] for t in cand})
        promoted += decide(base, results(cand), config).promote
    # 300 simulated canaries: the binomial sd of the rate is ~0.025; the bootstrap's
    # slight optimism and the normal approximation move it by a few points
    assert abs(promoted / sims - expected) < 0.09


# ---------------------------------------------------------------- the anchor


def test_a_chain_of_small_losses_is_stopped_by_the_anchor():
    """v1 loses 0.05 to v0 and v2 loses 0.07 to v1, each within the 0.1 margin, so a gate
    that sees only the version it replaces promotes both; against the anchor v0, v2 is
    0.12 worse and the anchor margin of 0.1 rejects it."""
    v0, v1, v2 = (results(tasks(10, [r, r])) for r in (1.0, 0.95, 0.88))
    plain = GateConfig(margin=0.1)
    assert decide(v0, v1, plain).promote and decide(v1, v2, plain).promote
    anchored = GateConfig(margin=0.1, anchor_margin=0.1)
    first = decide(v0, v1, anchored, anchor=v0)  # the first cycle: the anchor is the promoted version
    assert first.promote and first.anchor is not None and first.anchor.mean_diff == pytest.approx(-0.05)
    d = decide(v1, v2, anchored, anchor=v0)
    assert d.verdict == "reject" and d.mean_diff == pytest.approx(-0.07)
    assert d.anchor is not None and d.anchor.mean_diff == pytest.approx(-0.12) and d.anchor.n_tasks == 10
    assert (d.anchor.anchor_mean, d.anchor.candidate_mean) == (pytest.approx(1.0), pytest.approx(0.88))
    assert "drifted down" in d.reasons[-1] and "vs the anchor -0.120" in d.summary()
    # a candidate that wins back what the chain lost passes both checks
    back = decide(v1, results(tasks(10, [1.0, 1.0])), anchored, anchor=v0)
    assert back.promote and "within -0.1" in back.reasons[-1]


def test_the_anchor_check_never_promotes_what_the_main_check_rejects():
    v0 = results(tasks(10, [0.5, 0.5]))
    worse = results(tasks(10, [0.2, 0.2]))
    d = decide(results(tasks(10, [1.0, 1.0])), worse, GateConfig(margin=0.1, anchor_margin=0.5), anchor=v0)
    assert d.verdict == "reject" and d.anchor is not None and d.anchor.ci_low == pytest.approx(-0.3)


def test_too_few_anchor_pairs_is_inconclusive():
    """An anchor that played other tasks (a changed canary) cannot vouch for the candidate."""
    v1 = results(tasks(10, [1.0]))
    other = results({f"x{i:02d}": [1.0] for i in range(10)})
    d = decide(v1, v1, GateConfig(anchor_margin=0.1), anchor=other)
    assert d.verdict == "inconclusive" and d.anchor is not None and d.anchor.n_tasks == 0
    assert "pair the candidate with the anchor" in d.reasons[-1]


def test_anchor_results_go_with_an_anchor_margin():
    v = results(tasks(8, [1.0]))
    with pytest.raises(ValueError, match="anchor results missing"):
        decide(v, v, GateConfig(anchor_margin=0.1))
    with pytest.raises(ValueError, match="anchor results given"):
        decide(v, v, GateConfig(), anchor=v)
    with pytest.raises(ValueError, match="anchor seed 0 twice|task 't00' seed 0 twice"):
        decide(v, v, GateConfig(anchor_margin=0.1), anchor=v + v[:1])
    with pytest.raises(ValidationError):
        GateConfig(anchor_margin=-0.1)


def test_a_decision_with_an_anchor_serializes_and_an_old_one_still_reads():
    v0 = results(tasks(8, [1.0, 0.0]))
    d = decide(v0, results(tasks(8, [0.0, 1.0])), GateConfig(margin=0.05, anchor_margin=0.05), anchor=v0)
    stored = json.loads(json.dumps(d.model_dump(mode="json")))
    assert GateDecision.model_validate(stored) == d and stored["anchor"]["n_pairs"] == 16
    del stored["anchor"], stored["config"]["anchor_margin"]  # what a decision stored before the anchor holds
    assert GateDecision.model_validate(stored).anchor is None


def test_the_decision_says_when_the_candidate_is_indistinguishable_from_production():
    """Issue 66: v1 was promoted on "mean diff +0.000" with 11 of 12 canary pairs playing the
    same episodes and 5 of 6 update groups without reward variance; the decision line and
    its evidence say so, and a candidate identical on every pair is called indistinguishable."""
    from seed_agents.continual.gate import UpdateSignal

    def played(fingerprints: list[str]) -> list[CanaryResult]:
        return [CanaryResult(task_id=f"t{i // 2:02d}", seed=i % 2, reward=0.0, fingerprint=f) for i, f in
                enumerate(fingerprints)]

    same = [f"did-{i}" for i in range(12)]
    update = UpdateSignal(groups=6, flat_groups=5)
    d = decide(played(same), played([*same[:11], "other"]), GateConfig(min_tasks=2), update=update)
    assert (d.verdict, d.identical_pairs, d.update, d.indistinguishable) == ("promote", 11, update, False)
    assert d.summary().endswith("(6 tasks, 12 pairs); 11/12 canary pairs identical, 5/6 update groups without reward "
                                "variance")
    stored = json.loads(json.dumps(d.model_dump(mode="json")))
    assert (stored["identical_pairs"], stored["update"]) == (11, {"groups": 6, "flat_groups": 5})
    assert GateDecision.model_validate(stored) == d

    copy = decide(played(same), played(same), GateConfig(min_tasks=2), update=UpdateSignal(groups=6, flat_groups=6))
    assert copy.indistinguishable and "; indistinguishable from the promoted version: 12/12 canary pairs identical" \
        in copy.summary()
    assert any("indistinguishable" in r for r in copy.reasons) and any("taught nothing" in r for r in copy.reasons)
    # faulted pairs are not compared; results without fingerprints say nothing about sameness
    faulted = played(same)
    faulted[0] = faulted[0].model_copy(update={"fault": FaultKind.BACKEND})
    assert decide(faulted, played(same), GateConfig(min_tasks=2)).identical_pairs == 11
    unknown = decide(results(tasks(8, [1.0])), results(tasks(8, [1.0])))
    assert unknown.identical_pairs is None and not unknown.indistinguishable and "identical" not in unknown.summary()
