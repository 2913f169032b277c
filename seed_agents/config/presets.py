"""Presets: named sets of settings that a command's config starts from (``--preset NAME``),
under a ``--config`` YAML and the flags: defaults < preset < YAML < flags.

``paper`` is the SEED paper's method as written (arXiv 2607.14777): its objective's
coefficients (``PAPER``), its RL learning rate with TRL's linear decay, full fine-tuning,
skills written for every episode (failures get avoidance rules), no guided openings,
rollouts sampled from the policy's own distribution (T 1.0) and its stage-1 SFT. It holds
the method, not the budget: the paper's model, tasks per update, group size, updates and
turns are in ``configs/paper_*.yaml``. ``train``'s defaults differ where a learning run here
chose otherwise (docs/training.md, "Defaults and why"); ``configs/paper.yaml`` is this preset
as a file (a test holds the two equal).
"""

from __future__ import annotations

from typing import Any

from seed_agents.config.core import PAPER, PAPER_LEARNING_RATE, PAPER_SFT_LEARNING_RATE

__all__ = ["MAIN_JOB", "PAPER_PRESET", "PRESETS", "TASK_SOURCES"]

PAPER_PRESET: dict[str, Any] = {
    # the paper's rollout temperature is not in this project's notes; 1.0 samples the
    # policy's own distribution, as configs/paper_*.yaml do
    "sampling": {"temperature": 1.0},
    "skills": {"failures": "write"},
    "trainer": {
        "learning_rate": PAPER_LEARNING_RATE, "lr_schedule": "linear", "lora_r": None,
        "opd_coef": PAPER.lam, "gate_sharpness": PAPER.gate_sharpness, "kl_coef": PAPER.kl,
        "entropy_coef": PAPER.entropy, "clip_eps": PAPER.clip_eps, "max_grad_norm": 1.0,
        "advantage_norm": "mean_std", "guide_share": 0.0,
    },
    "stage1": {"temperature": 0.4, "epochs": 3.0, "learning_rate": PAPER_SFT_LEARNING_RATE, "lora_r": None},
}

PRESETS: dict[str, dict[str, Any]] = {"paper": PAPER_PRESET}


MAIN_JOB: dict[str, Any] = {
    "num_tasks": 200, "tasks_per_iteration": 4, "iterations": 6,
    "graph": {"build": "seed_agents.tools.atlas:build_free_agent", "tasks": "seed_agents.tools.atlas:train_tasks",
              "reward": "seed_agents.tools.atlas:answer_reward"},
    "backend": {"max_batch_size": 32},
    "sampling": {"max_tokens": 64},
    "runner": {"group_size": 8, "concurrency": 32},
    "skills": {"max_tokens": 64},
    # a free agent learned to call at 1e-3 (guided openings); at 3e-4 it did not transfer
    "trainer": {"learning_rate": 1e-3},
    "stage1": {"run": "off"},
    "eval": {"tasks": "seed_agents.tools.atlas:heldout_tasks", "num_tasks": 120, "every": 6, "at_start": True},
}
"""`seed-agents train`'s job where the config and the flags name no task source (no ``graph``,
``env`` or ``store``): SEED on the atlas tool agent left free to choose its tools
(``seed_agents.tools.atlas``), held-out success before and after on 120 questions about places
never trained on. It lies under ``--preset``, ``--config`` and the flags like the defaults;
``configs/atlas_agent.yaml`` is the same job as a file (a test holds the two equal)."""

TASK_SOURCES = ("graph", "env", "store")
"""The keys that name what `train` plays; naming one of them leaves ``MAIN_JOB`` out."""
