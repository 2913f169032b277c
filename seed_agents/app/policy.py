"""The trainable policy: its weights (after stage 1 where it applies), the model, the backend
that samples from it, the weight sync that serves each update, and TRL's arguments.

Shared by ``seed-agents train`` (``seed_agents.app.train``) and the continual loop
(``seed_agents.app.continual``), so a cycle's update is built exactly as a run's. This is
the app layer: it imports the trainers at the top; the CLI imports it only inside the
commands that train, so ``seed-agents --help`` and ``eval`` load no TRL.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.integrations import get_available_reporting_integrations

from seed_agents.app import own_server
from seed_agents.app.builders import open_backend, open_chat_model
from seed_agents.app.own_server import owns_server
from seed_agents.backends import local_kwargs
from seed_agents.backends.local import LocalBackend
from seed_agents.chat_model import SeedChatModel
from seed_agents.config import BackendConfig, TrainConfig
from seed_agents.errors import ConfigError
from seed_agents.models import resolve_model
from seed_agents.precision import resolve_attention, resolve_served
from seed_agents.stage1.auto import stage1_model
from seed_agents.trainers.seed_trainer import SEEDConfig
from seed_agents.trainers.weight_sync import FullWeightSync, InProcessSync, LoRASync


def initial_weights(backend: BackendConfig) -> str:
    """The weights a run starts from: ``backend.weights``; else, in-process, the model
    itself; else (a server) the local copy named by ``tokenizer``, then the served name."""
    if backend.weights:
        return backend.weights
    return backend.model if backend.kind == "local" else (backend.tokenizer or backend.model)


@dataclass
class Policy:
    """The trainer's model and everything that samples from it or serves it."""
    weights: str  # the folder the run starts from (the stage-1 model where it applies)
    tokenizer: Any
    model: Any
    backend: Any
    sync: Any
    llm: Any  # SeedChatModel over ``backend``


def build_policy(cfg: TrainConfig, out: Path, owned: contextlib.ExitStack | None = None) -> Policy:
    """Stage 1 (skill SFT) first where it applies, then the model, its backend (in-process,
    a vLLM server checked to answer, or one started here for the run's weights and stopped
    when ``owned`` closes) and the weight sync that fits them."""
    served = cfg.backend
    stage1_dir = stage1_model(cfg)
    weights = str(stage1_dir) if stage1_dir is not None else resolve_model(initial_weights(served))
    if owns_server(served):
        if owned is None:
            raise ConfigError("backend.base_url is unset: give the URL of the vLLM server to train")
        served = owned.enter_context(own_server.served(served, weights, lora_r=cfg.trainer.lora_r))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(served.tokenizer) if served.tokenizer else weights)
    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
    if cfg.trainer.lora_r:
        model = get_peft_model(model, LoraConfig(r=cfg.trainer.lora_r, lora_alpha=cfg.trainer.lora_alpha,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    if served.kind == "local":  # the trainer's own model samples: every update is live at once
        backend: Any = LocalBackend(model, tokenizer=tokenizer, max_batch_size=served.max_batch_size,
                                    **local_kwargs(served, who="policy (rollouts and update alike)"))
        sync: Any = InProcessSync(backend)
    else:
        backend, _ = open_backend(served)
        lora = cfg.sync == "lora" or (cfg.sync == "auto" and cfg.trainer.lora_r)
        sync = (LoRASync(backend, out / "weights") if lora
                else FullWeightSync(backend, out / "weights", method=served.reload_method))
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=cfg.sampling, model_name=served.model)
    return Policy(weights=weights, tokenizer=tokenizer, model=model, backend=backend, sync=sync, llm=llm)


def build_analyzer(cfg: TrainConfig, policy: Policy, suite: Any = None) -> Any:
    """Who writes the hindsight skills: the policy itself (SEED), another model (external),
    a frozen copy of the initial policy, or the env suite's offline analyzer (``suite``)."""
    skills = cfg.skills
    if skills.source == "rule_based":
        offline = suite.offline_analyzer() if suite is not None else None
        if offline is None:
            raise ConfigError(f"skills.source rule_based: the env {cfg.env!r} offers no offline analyzer; "
                              f"use self, external or frozen")
        return offline
    if skills.source not in ("external", "frozen"):
        return policy.llm
    if skills.chat_model is not None:
        from seed_agents.stage1.analyzers import LangChainAnalyzer

        try:
            return LangChainAnalyzer.from_spec(skills.chat_model, skills.chat_model_kwargs,
                                               max_concurrency=cfg.runner.concurrency)
        except (ValueError, TypeError) as e:  # a bad import path or arguments: the user's config
            raise ConfigError(f"skills.chat_model: {e}") from None
    if skills.analyzer is not None:
        return open_chat_model(skills.analyzer, model_name="analyzer")
    frozen = LocalBackend(policy.weights, max_batch_size=cfg.backend.max_batch_size)  # a copy of the initial policy
    return SeedChatModel(backend=frozen, tokenizer=frozen.tokenizer, model_name="analyzer")


def check_report_to(integrations: list[str]) -> None:
    """Each ``trainer.report_to`` integration's package is installed (transformers would
    raise only once training starts)."""
    if not integrations:
        return
    missing = sorted(set(integrations) - set(get_available_reporting_integrations()))
    if missing:
        raise ConfigError(f"trainer.report_to: {', '.join(missing)} is not installed here; pip install it "
                          f"(e.g. pip install {missing[0]}) or remove it from report_to")


def trainer_dtype(served: BackendConfig) -> torch.dtype:
    """The number format the update computes in: the rollouts' (``resolve_served``), so the
    logprobs they recorded match the trainer's; only an explicit bfloat16 splits them."""
    return resolve_served(served.precision, served.kind)[0]


def compute_format(served: BackendConfig) -> dict[str, str]:
    """What a run's numbers are computed in on this machine, as its settings resolve here
    (``auto`` depends on the CPU): the update's format and, for a local backend, the
    rollouts' and their attention's."""
    def name(dtype: torch.dtype) -> str:
        return str(dtype).removeprefix("torch.")

    fmt = {"update": name(trainer_dtype(served))}
    if served.kind == "local":
        dtype = trainer_dtype(served)
        fp32_attention = dtype == torch.float32 or resolve_attention(served.attention, dtype)[0]
        fmt.update(rollouts=name(dtype), attention="float32" if fp32_attention else name(dtype))
    return fmt


def seed_config(cfg: TrainConfig, out: Path) -> Any:
    """The TRL arguments of a run: one optimizer step per iteration, a checkpoint per step."""
    group, trainer = cfg.runner.group_size, cfg.trainer
    return SEEDConfig(
        output_dir=str(out / "checkpoints"), per_device_train_batch_size=cfg.tasks_per_iteration * group,
        num_generations=group, max_steps=cfg.iterations, learning_rate=trainer.learning_rate,
        lr_scheduler_type=trainer.lr_schedule, beta=trainer.kl_coef,
        entropy_coef=trainer.entropy_coef, epsilon=trainer.clip_eps, max_grad_norm=trainer.max_grad_norm,
        opd_coef=trainer.opd_coef, gate_sharpness=trainer.gate_sharpness, advantage_norm=trainer.advantage_norm,
        use_cpu=not torch.cuda.is_available(), bf16=trainer_dtype(cfg.backend) == torch.bfloat16,
        gradient_checkpointing=trainer.gradient_checkpointing, keep_activations_gb=None if trainer.keep_activations_gb == "auto" else trainer.keep_activations_gb,
        chunk_tokens=trainer.chunk_tokens,
        share_prefix=trainer.share_prefix, fuse_teacher=trainer.fuse_teacher, release_memory=trainer.release_memory,
        sampled_head=trainer.sampled_head,
        report_to=list(trainer.report_to), run_name=out.name, logging_steps=1, save_strategy="steps", save_steps=1,
        save_total_limit=2, seed=cfg.seed, disable_tqdm=True,
    )
