"""The SEED math on hand-computed tensors."""

import math

import pytest
import torch

from seed_agents.distill import (
    SEEDCoefficients,
    entropy_from_logits,
    gated_opd_loss,
    group_advantages,
    kl_k3,
    masked_mean,
    ppo_clip_loss,
    seed_objective,
)


def test_group_advantages_mean_std_uses_unbiased_std_per_group():
    adv = group_advantages([1.0, 0.0, 0.0, 5.0, 5.0], ["a", "a", "a", "b", "b"])
    # group a: mean 1/3, unbiased std sqrt(1/3)
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    assert adv[:3].tolist() == pytest.approx([(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6)])
    assert adv[3:].tolist() == [0.0, 0.0]  # identical rewards: no signal


def test_group_advantages_mean_only_and_singletons():
    assert group_advantages([1.0, 3.0, 7.0], ["a", "a", "b"], norm="mean").tolist() == [-1.0, 1.0, 0.0]
    assert group_advantages([4.0], ["x"]).tolist() == [0.0]
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0], ["a"])
    with pytest.raises(ValueError):
        group_advantages([1.0], ["a"], norm="zscore")


def test_gated_opd_loss_value_and_gate():
    ls = torch.tensor([[-1.0, -2.0, -3.0]])
    lt = torch.tensor([[-0.5, -2.5, -3.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, gate = gated_opd_loss(ls, lt, mask, gate_sharpness=5.0)
    g1, g2 = 1 / (1 + math.exp(-2.5)), 1 / (1 + math.exp(2.5))
    assert loss.item() == pytest.approx((g1 * 0.5 + g2 * -0.5) / 2)
    assert gate.item() == pytest.approx((g1 + g2) / 2)


def test_gated_opd_gradient_flows_only_through_the_student():
    ls = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    lt = torch.tensor([[-0.5, -2.5]], requires_grad=True)
    loss, _ = gated_opd_loss(ls, lt, torch.ones(1, 2), gate_sharpness=5.0)
    loss.backward()
    assert lt.grad is None or torch.all(lt.grad == 0)
    gates = torch.sigmoid(5.0 * (lt.detach() - ls.detach()))
    assert torch.allclose(ls.grad, -gates / 2)  # d/dls of mean(g * (lt - ls)) with g held fixed


def test_ungated_opd_is_imitation_whatever_the_teacher_says():
    """gate_sharpness 0, the imitation control: every masked token is raised at half weight,
    the teacher's log-probs moving the loss's value but never its gradient."""
    grads = []
    for teacher in ([[-0.5, -2.5, 0.0]], [[-9.0, -0.1, 0.0]]):
        ls = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
        loss, gate = gated_opd_loss(ls, torch.tensor(teacher), torch.tensor([[1, 1, 0]]), gate_sharpness=0.0)
        loss.backward()
        assert gate.item() == 0.5
        grads.append(ls.grad)
    assert torch.equal(grads[0], grads[1])
    assert grads[0].tolist() == [[-0.25, -0.25, 0.0]]  # -0.5 / 2 masked tokens; padding untouched


def test_ppo_clip_loss_hand_computed():
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.75, 0.25]]))  # ratios 1.5, 0.5
    loss, frac = ppo_clip_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), clip_eps=0.2)
    # A=1: min(1.5, 1.2)=1.2 ; min(0.5, 0.8)=0.5
    assert loss.item() == pytest.approx(-(1.2 + 0.5) / 2)
    assert frac.item() == 1.0
    loss_neg, _ = ppo_clip_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 2), clip_eps=0.2)
    # A=-1: min(-1.5, -1.2) = -1.5 ; min(-0.5, -0.8) = -0.8
    assert loss_neg.item() == pytest.approx((1.5 + 0.8) / 2)


def test_kl_k3_is_zero_at_equality_and_positive_otherwise():
    lp = torch.tensor([[-1.0, -2.0]])
    assert torch.allclose(kl_k3(lp, lp), torch.zeros(1, 2))
    ref = torch.tensor([[-1.5, -1.0]])
    d = ref - lp
    assert torch.allclose(kl_k3(lp, ref), torch.exp(d) - d - 1) and torch.all(kl_k3(lp, ref) > 0)


def test_entropy_of_uniform_and_masked_mean():
    assert entropy_from_logits(torch.zeros(1, 1, 4)).item() == pytest.approx(math.log(4))
    assert masked_mean(torch.tensor([[1.0, 100.0]]), torch.tensor([[1, 0]])).item() == 1.0
    assert masked_mean(torch.tensor([[1.0]]), torch.tensor([[0]])).item() == 0.0


def test_seed_objective_with_lambda_zero_is_grpo():
    torch.manual_seed(0)
    lp = torch.randn(2, 3, requires_grad=True)
    args = (lp, lp.detach() + 0.1 * torch.randn(2, 3), torch.tensor([1.0, -1.0]), torch.ones(2, 3))
    teacher = lp.detach() + torch.randn(2, 3)
    seed_loss, m = seed_objective(*args, teacher_logp_B_T=teacher, coef=SEEDCoefficients(lam=0.0, entropy=0, kl=0))
    grpo_loss, _ = seed_objective(*args, coef=SEEDCoefficients(lam=0.0, entropy=0, kl=0))
    assert seed_loss.item() == grpo_loss.item() and "loss/opd" not in m
    with_opd, m2 = seed_objective(*args, teacher_logp_B_T=teacher, coef=SEEDCoefficients(entropy=0, kl=0))
    assert with_opd.item() == pytest.approx(grpo_loss.item() + 0.01 * m2["loss/opd"], abs=1e-6)


def test_seed_objective_opd_mask_limits_distillation_to_rows_with_skills():
    lp = torch.zeros(2, 2, requires_grad=True)
    teacher = torch.full((2, 2), 1.0)
    loss, m = seed_objective(lp, lp.detach(), torch.zeros(2), torch.ones(2, 2), teacher_logp_B_T=teacher,
                             opd_mask_B_T=torch.tensor([[1, 1], [0, 0]]), coef=SEEDCoefficients(entropy=0, kl=0))
    loss.backward()
    assert m["opd/tokens"] == 2.0
    assert torch.all(lp.grad[1] == 0) and torch.all(lp.grad[0] < 0)
