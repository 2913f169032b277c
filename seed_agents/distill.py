"""The SEED math as small pure functions (no trainer, no model, no I/O).

Shapes: ``B`` rows, ``T`` completion tokens per row (padded), ``V`` vocabulary.
Every loss is a *masked token-mean* over the whole batch: padding and tokens the
policy did not sample (observations inside merged rows, episodes without a skill for
the OPD term) have mask 0 and contribute nothing.

Objective per sampled token (docs/architecture.md, "The SEED objective"):
    L = L_ppo_clip(A) - c_ent * H + lambda * L_opd + c_kl * KL_k3(pi || pi_ref)
with the gated on-policy distillation term
    delta_t = stopgrad(l_skill_t - l_theta_t);  g_t = sigmoid(gate_sharpness * delta_t)
    L_opd   = masked_mean(g_t * (stopgrad(l_skill_t) - l_theta_t))
whose gradient is -g_t * grad l_theta_t: raise the probability of the sampled token
where the skill-conditioned policy (the teacher) likes it more than the student does,
softly gated so tokens the teacher dislikes are pushed less. ``gate_sharpness`` is the
paper's beta, renamed because TRL's ``beta`` (``SEEDConfig.beta``) is the KL coefficient.
At ``gate_sharpness`` 0 the gate is 0.5 everywhere and the term is plain imitation of the
sampled tokens (gradient ``-0.5 * grad l_theta``), the teacher irrelevant: a control that
tells what the gate adds from what raising the sampled tokens of skill-bearing episodes does.
The coefficients and their paper defaults are ``seed_agents.config.core.SEEDCoefficients``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from seed_agents.config.core import PAPER, SEEDCoefficients

__all__ = ["SEEDCoefficients", "entropy_from_logits", "gated_opd_loss", "group_advantages", "kl_k3", "masked_mean",
           "ppo_clip_loss", "seed_objective"]


def masked_mean(x_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1; 0 when the mask is empty."""
    mask = mask_B_T.to(x_B_T.dtype)
    return (x_B_T * mask).sum() / mask.sum().clamp(min=1.0)


def group_advantages(
    rewards_N: torch.Tensor | Sequence[float],
    group_ids: Sequence[str],
    norm: Literal["mean_std", "mean"] = "mean_std",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages: ``(r - mean_g) / (std_g + eps)`` or ``r - mean_g``.

    The statistics are taken over every entry of the group (one entry per row, so an
    episode split into several step-level rows counts once per row, as in the paper's
    code). ``std`` is ``torch.std`` (unbiased); a group of one has std 0.
    """
    rewards = torch.as_tensor(rewards_N, dtype=torch.float32)
    if rewards.ndim != 1 or len(rewards) != len(group_ids):
        raise ValueError(f"rewards {tuple(rewards.shape)} and {len(group_ids)} group ids do not line up")
    if norm not in ("mean_std", "mean"):
        raise ValueError(f"norm must be 'mean_std' or 'mean', got {norm!r}")
    adv = torch.empty_like(rewards)
    for gid in dict.fromkeys(group_ids):
        idx = torch.tensor([i for i, g in enumerate(group_ids) if g == gid])
        group_rewards = rewards[idx]
        centered = group_rewards - group_rewards.mean()
        if norm == "mean_std":
            std = group_rewards.std() if len(group_rewards) > 1 else torch.tensor(0.0)
            centered = centered / (std + eps)
        adv[idx] = centered
    return adv


def gated_opd_loss(
    logp_student_B_T: torch.Tensor,
    logp_teacher_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    gate_sharpness: float = PAPER.gate_sharpness,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, mean gate). Gradient flows only through ``logp_student``."""
    teacher = logp_teacher_B_T.detach()
    delta = teacher - logp_student_B_T.detach()
    gate = torch.sigmoid(gate_sharpness * delta)
    loss = masked_mean(gate * (teacher - logp_student_B_T), mask_B_T)
    return loss, masked_mean(gate, mask_B_T)


def ppo_clip_loss(
    logp_B_T: torch.Tensor,
    old_logp_B_T: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    clip_eps: float = PAPER.clip_eps,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, clip fraction) of the PPO clipped surrogate, advantages broadcast per row."""
    ratio = torch.exp(logp_B_T - old_logp_B_T.detach())
    adv = advantages_B.detach().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask_B_T)
    clip_frac = masked_mean(((ratio - 1).abs() > clip_eps).float(), mask_B_T)
    return loss, clip_frac


def kl_k3(logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor) -> torch.Tensor:
    """Low-variance, non-negative KL(pi || pi_ref) estimator per token (Schulman's k3)."""
    d = ref_logp_B_T.detach() - logp_B_T
    return torch.exp(d) - d - 1


def entropy_from_logits(logits_B_T_V: torch.Tensor) -> torch.Tensor:
    logp = logits_B_T_V.float().log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def seed_objective(
    logp_B_T: torch.Tensor,
    old_logp_B_T: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    *,
    entropy_B_T: torch.Tensor | None = None,
    ref_logp_B_T: torch.Tensor | None = None,
    teacher_logp_B_T: torch.Tensor | None = None,
    opd_mask_B_T: torch.Tensor | None = None,
    coef: SEEDCoefficients = SEEDCoefficients(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """The combined loss and its parts (as floats, for logging).

    Terms whose inputs are missing (no reference model, no skills this batch) or whose
    coefficient is 0 are left out, so ``lam=0`` reproduces GRPO exactly.
    """
    ppo, clip_frac = ppo_clip_loss(logp_B_T, old_logp_B_T, advantages_B, mask_B_T, coef.clip_eps)
    loss = ppo
    metrics = {"loss/ppo": ppo.item(), "clip_frac": clip_frac.item()}
    if entropy_B_T is not None and coef.entropy:
        ent = masked_mean(entropy_B_T, mask_B_T)
        loss = loss - coef.entropy * ent
        metrics["entropy"] = ent.item()
    if ref_logp_B_T is not None and coef.kl:
        kl = masked_mean(kl_k3(logp_B_T, ref_logp_B_T), mask_B_T)
        loss = loss + coef.kl * kl
        metrics["kl"] = kl.item()
    if teacher_logp_B_T is not None and coef.lam:
        opd_mask = mask_B_T if opd_mask_B_T is None else mask_B_T * opd_mask_B_T
        opd, gate = gated_opd_loss(logp_B_T, teacher_logp_B_T, opd_mask, coef.gate_sharpness)
        loss = loss + coef.lam * opd
        metrics.update({"loss/opd": opd.item(), "opd/gate": gate.item(), "opd/tokens": float(opd_mask.sum().item())})
    metrics["loss/total"] = loss.item()
    return loss, metrics
