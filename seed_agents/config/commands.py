"""The commands' configs: ``seed-agents eval`` and ``seed-agents train`` (and the sections
they compose). Field descriptions are the CLI help: the app generates each command's flags
from these models (``seed_agents.app.flags``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from seed_agents.config.core import PAPER, AgentConfig, BackendConfig, RunnerConfig
from seed_agents.config.evidence import because
from seed_agents.config.loading import RenamedConfigKey
from seed_agents.types import AnswerFormat, SamplingParams, SkillFailures, SkillOpening


# The learning results the defaults come from (docs/results.md; tests/unit/test_defaults_table.py
# checks every anchor).
CONSTANT_RATE = "results.md#a-constant-learning-rate-3e-4-without-decay-three-seeds-0138-the-goal-met-seed-the-same"
LORA_RANK = "results.md#the-lora-rank-probes-at-r32-and-r2-one-seed-each-rank-8-kept"
OWN_SUCCESS_SKILLS = ("results.md#seed-with-its-own-skills-on-successes-only-at-opd-weight-01-far-above-grpo-five-seeds-"
                      "0203-paired")
GUIDED_OPENINGS = "results.md#guided-openings-at-a-constant-1e-3-the-free-agent-learns-to-call-three-seeds-the-goal-met"
TEMPERATURE_BAND = "results.md#the-other-knob-the-training-temperature"


class EvalConfig(BaseModel):
    """`seed-agents eval`: play an environment and record everything."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("textworld", description="Environment suite name (entry point group seed_agents.envs).")
    split: str | None = Field(None, description="Task split to play (default: the suite's eval_split, else eval_seen).")
    episodes: int = Field(8, ge=1, le=100000, description="Total episodes = tasks x group; must be a multiple of group.")
    seed: int = Field(0, description="Seed for sampling and env shuffles.")
    out: Path = Field(Path("runs/eval"), description="Output directory.")
    backend: BackendConfig = BackendConfig()
    # nested defaults are instances, not factories, so `--help` can print each field's
    # default (pydantic copies them for every config)
    sampling: SamplingParams = SamplingParams(max_tokens=24, temperature=0.7)
    runner: RunnerConfig = RunnerConfig(group_size=1)
    agent: AgentConfig = AgentConfig()
    env_options: dict[str, Any] = Field({}, description="Extra keyword arguments for the env suite.")

    @model_validator(mode="after")
    def _groups(self) -> EvalConfig:
        group = self.runner.group_size
        if self.episodes % group:
            raise ValueError(f"episodes ({self.episodes}) must be a multiple of group ({group})")
        return self

    @property
    def num_tasks(self) -> int:
        return self.episodes // self.runner.group_size


class SkillConfig(BaseModel):
    """Where hindsight skills come from and how they enter the teacher prompt."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["self", "external", "frozen", "rule_based", "none"] = Field("self", description=(
        "Who writes the hindsight skills. self: the policy (SEED); none: nobody (plain GRPO); external: "
        "another model; frozen: the initial policy; rule_based: the env suite's offline analyzer."))
    injector: Literal["system", "task_line", "last_turn"] = Field("system", description=(
        "Where the skill sits in the teacher prompt. system: the system message; task_line: after 'Your "
        "task is to:' (ALFWorld); last_turn: right before the model's turn."))
    min_words: int = Field(5, ge=1, description="Shorter skills are rejected.")
    max_words: int = Field(120, ge=5, description="Longer skills are rejected.")
    max_tokens: int = Field(256, ge=16, le=8192, description="Analyzer completion budget.")
    answer_format: AnswerFormat = Field("paper", description=(
        "The analyzer prompt's reply example (seed_agents.skills.ANSWER_FORMATS). paper: a type name per "
        "value; described: what each value should hold; workflow: a sentence frame with slots."))
    opening: SkillOpening = Field("words", description=(
        "How a skill the served model writes opens. words: the paper's free text; call: 'Call <tool> with"
        " ...', naming a tool the episode offered (docs/training.md, Skills)."))
    failures: SkillFailures | Literal["auto"] = Field("auto", description=(
        "write: a failed episode gets a skill too (the paper's avoidance rules); skip: no analyzer call for it, and "
        "its rows get no teacher. auto: skip for a graph or stored sessions, write for an env suite."),
        json_schema_extra=because(
        "On a graph the policy's own skills on successes only beat GRPO on five of five seeds, where skills on every "
        "episode left SEED at GRPO's level; an env suite's stage 1 learns from the base policy's mostly failed "
        "episodes, and no run here tried skip there.", OWN_SUCCESS_SKILLS))
    analyzer: BackendConfig | None = Field(None, description="Backend of the external/frozen analyzer (default: a local copy of the initial policy).")
    chat_model: str | None = Field(None, description=(
        "external: import path 'pkg.module:ChatModelOrFactory' of a LangChain chat model that writes the "
        "skills instead of a served model (e.g. a hosted API model)."))
    chat_model_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for chat_model.")

    @model_validator(mode="after")
    def _one_analyzer(self) -> SkillConfig:
        if self.chat_model is not None and self.source != "external":
            raise ValueError(f"skills.chat_model writes external skills: it needs skills.source external, not {self.source!r}")
        if self.chat_model is not None and self.analyzer is not None:
            raise ValueError("skills.analyzer and skills.chat_model both name who writes the skills: keep one")
        if self.chat_model_kwargs and self.chat_model is None:
            raise ValueError("skills.chat_model_kwargs without skills.chat_model")
        return self


ReportTo = Literal["azure_ml", "clearml", "codecarbon", "comet_ml", "dagshub", "dvclive", "flyte", "kubeflow", "mlflow",
                   "neptune", "swanlab", "tensorboard", "trackio", "wandb"]
"""The integrations transformers' ``report_to`` knows (tests/unit/test_report_to.py checks them
against transformers' own table); each needs its package installed (checked before a run)."""


class TrainerConfig(BaseModel):
    """Optimization; names follow TRL's GRPOConfig where they exist. A default a learning run
    here chose says why (docs/training.md, "Defaults and why").

    ``--preset paper`` gives the paper's settings."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(3e-4, gt=0, le=1.0, description="The optimizer's learning rate (the paper's: 1e-6, "
                                 "with full weights).", json_schema_extra=because(
        "LoRA r8 at a constant 3e-4 met the held-out goal on the atlas curves (the free agent with guided openings "
        "learned at 1e-3); no run here trained full weights at the paper's 1e-6 or set the two side by side.",
        CONSTANT_RATE))
    lr_schedule: Literal["linear", "constant"] = Field("constant", description="linear: the rate decays to 0 over the "
                                                       "run's iterations (TRL's default, the paper's); constant: every "
                                                       "step at learning_rate.", json_schema_extra=because(
        "On the atlas curve a constant rate doubled the held-out gain of the same runs decaying to 0, every seed at "
        "least as good.", CONSTANT_RATE))
    opd_coef: float = Field(0.1, ge=0, description="lambda, the weight of the gated OPD term; 0 turns SEED into GRPO "
                            "(the paper's: 0.01).", json_schema_extra=because(
        "Every run where SEED beat GRPO weighed the term 0.1; at the paper's 0.01 SEED stayed at GRPO's level, with "
        "its own skills (three seeds) and with oracle ones (one seed).", OWN_SUCCESS_SKILLS))
    gate_sharpness: float = Field(PAPER.gate_sharpness, ge=0, description=(
        "Sharpness s of the OPD gate sigmoid(s * (teacher - student logprob)), the paper's beta. 0: no "
        "gate and no teacher pass, a control that imitates skill-bearing episodes."))
    kl_coef: float = Field(PAPER.kl, ge=0, description="KL(pi || pi_ref) coefficient (TRL's beta).",
                           json_schema_extra=because(
        "Kept at the paper's: the atlas curves ran 0.001, and no run compared the two weights.", CONSTANT_RATE))
    entropy_coef: float = Field(PAPER.entropy, ge=0, description="Entropy bonus.")
    clip_eps: float = Field(PAPER.clip_eps, gt=0, lt=1, description="PPO clip range.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping.")
    advantage_norm: Literal["mean_std", "mean"] = Field("mean_std", description="Group advantage normalization.")
    merge_rows: bool = Field(True, description="Merge calls whose tokens continue into one row.")
    gradient_checkpointing: bool = Field(True, description=(
        "Recompute activations in backward for an update whose activations do not fit under "
        "keep_activations_gb: less memory for a little more compute. false: never recompute."))
    keep_activations_gb: Annotated[float, Field(ge=0)] | Literal["auto"] = Field(0.0, description=(
        "With gradient_checkpointing: an update whose activations are estimated under this many GB keeps "
        "them. auto: a third of the free memory; 0 (default): always recompute (docs/training.md)."))
    release_memory: bool = Field(True, description=(
        "Give freed heap memory back to the OS after each step's rollouts, scoring, update and held-out "
        "evaluation (glibc malloc_trim); no value changes. false: glibc's own behaviour."))
    lora_r: int | None = Field(8, ge=1, le=512, description=(
        "Train a LoRA adapter of this rank instead of full weights; null (in the --config file, or --preset paper): "
        "full fine-tuning, the paper's."), json_schema_extra=because(
        "Rank 8 learned on every atlas curve, where rank 2 learned slower and rank 32 fell (one seed each); no run "
        "here set LoRA beside full fine-tuning.", LORA_RANK))
    lora_alpha: int = Field(16, ge=1, description="LoRA alpha: the adapter's update is scaled by alpha / r.",
                            json_schema_extra=because(
        "Twice the rank, as on every atlas curve: the adapter's scale stays 2.", LORA_RANK))
    chunk_tokens: int = Field(8192, ge=0, le=1 << 20, description=(
        "Token budget (rows x trimmed width) of one forward in the loss and scoring, rows grouped by "
        "length; bounds the update's memory. 0: TRL's layout, every row padded to the widest."))
    share_prefix: bool = Field(True, description=(
        "Compute the prompt tokens a chunk's rows share once, in the teacher, reference and training "
        "passes (exact up to float rounding). false: every row's prompt whole, as TRL does."))
    sampled_head: bool = Field(True, description=(
        "Run the LM head, log-softmax and entropy only at the completion positions the loss trains (exact"
        " up to float rounding). false: every completion position, as TRL does."))
    fuse_teacher: bool = Field(False, description=(
        "Score SEED's teacher on the prompt keys and values the training forward computes, not in a pass "
        "of its own; needs share_prefix. Worth it with skills.injector last_turn (docs/training.md)."))
    guide_share: Annotated[float, Field(ge=0, le=1)] | Literal["auto"] = Field("auto", description=(
        "Share of each group's training episodes whose first free tool choice is steered into a call, trained as if "
        "chosen. auto: 0.5 where the first turn is free with tools bound, else 0; 0: off (paper)."),
        json_schema_extra=because(
        "Guided openings taught a free agent that never called a tool to call the right one on three seeds; auto "
        "applies them only where the first turn is free with tools bound, the case they were tried on.",
        GUIDED_OPENINGS))
    report_to: list[ReportTo] = Field([], description=(
        "Where TRL also sends the training metrics (tensorboard: <out>/checkpoints/runs/; wandb, mlflow "
        "and the others read their usual environment variables). metrics.jsonl is always written."))

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """``opd_beta`` (until 0.1) is ``gate_sharpness``: ``beta`` is TRL's KL coefficient."""
        if isinstance(data, dict) and "opd_beta" in data:
            if "gate_sharpness" in data:
                raise ValueError("opd_beta is the old name of gate_sharpness; keep only gate_sharpness")
            warnings.warn("trainer.opd_beta is deprecated: rename it to trainer.gate_sharpness (same meaning)",
                          RenamedConfigKey, stacklevel=2)
            data = {("gate_sharpness" if key == "opd_beta" else key): value for key, value in data.items()}
        return data

    @model_validator(mode="after")
    def _fused_teacher_reads_the_shared_prefix(self) -> TrainerConfig:
        if self.fuse_teacher and not self.share_prefix:
            raise ValueError("fuse_teacher scores the teacher on the prompt keys and values the shared-prefix forward "
                             "keeps: it needs share_prefix true")
        return self


class GraphConfig(BaseModel):
    """Train any LangGraph graph, not only an env suite: a builder, tasks and a reward."""

    model_config = ConfigDict(extra="forbid")

    build: str = Field(description="Import path 'pkg.module:fn'; fn(chat_model) returns a compiled graph.")
    tasks: Path = Field(description="JSONL file, one Task per line ({'task_id': ..., 'data': {...}}), or a function 'pkg.module:fn' returning them.")
    reward: str = Field(description="Import path of reward(task, final_state) -> float; success is reward >= 1.")
    input: Literal["task", "messages"] = Field("task", description="Graph input: {'task': Task}, or also {'messages': [user: task.data['question']]} (prebuilt agents).")


class Stage1Config(BaseModel):
    """Stage 1 before RL: SEED needs a policy that can already write parsable skills
    (docs/training.md, "Stage 1").

    The paper's ablation: 91.8 with stage 1, 86.0 without. With ``run: auto``, a SEED run
    (``skills.source: self``) on TextWorld with the local backend starts from a stage-1
    model: the base model after SFT on skills that the offline rule-based analyzer wrote
    about the base policy's own episodes. It is built once and cached by its settings.
    Elsewhere, build it with ``seed-agents skills collect`` + ``skills sft`` (any analyzer)
    and point ``backend.weights`` (or the served model) at the result."""

    model_config = ConfigDict(extra="forbid")

    run: Literal["auto", "off"] = Field("auto", description="auto: build or reuse the cached stage-1 model when it applies; off: start from backend.model.")
    num_tasks: int = Field(8, ge=1, description="Training tasks rolled out for skill collection.")
    group_size: int = Field(2, ge=1, description="Episodes per task.")
    temperature: float = Field(0.4, ge=0, description="Rollout temperature (paper: 0.4).")
    seed: int = Field(0, description="Seed of stage 1 (its own: RL runs with other seeds share one stage-1 model).")
    epochs: float = Field(3.0, gt=0, description="SFT epochs over the valid examples.")
    learning_rate: float = Field(5e-5, gt=0, description="SFT learning rate.")
    lora_r: int | None = Field(None, ge=1, description="SFT a LoRA adapter (merged into the saved model).")
    completion_head: bool = Field(True, description=(
        "The SFT applies the LM head to the completion tokens only (the same loss, a faster step). false:"
        " TRL's head over every position, to compare with TRL."))
    cache_dir: Path | None = Field(None, description="Where stage-1 models are cached (default: $SEED_AGENTS_CACHE/stage1).")


class StoreSourceConfig(BaseModel):
    """Train on a deployed agent's recorded sessions (``train --from-store URL``) instead of
    playing episodes.

    Each task key with at least two rewarded, unconsumed, unflagged sessions is a task, and
    its sessions are the GRPO group. Every session is claimed by exactly one update
    (``trainers.store_rollout``)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Trace store URL: sqlite:///path/traces.db or postgresql://user@host/db.")
    precedence: list[str] = Field(["verifier", "user", "judge"], description="Reward sources, most trusted first: the first source a session has sets its reward.")
    combine: Literal["first", "mean", "last"] = Field("first", description="How several rewards of the chosen source merge.")


class PeriodicEvalConfig(BaseModel):
    """Held-out evaluation during training: greedy episodes on tasks never trained on,
    before the first update and every ``every`` updates (and after the last one)."""

    model_config = ConfigDict(extra="forbid")

    split: str = Field("eval_seen", description="Env suite split to evaluate on (never the training split).")
    tasks: Path | None = Field(None, description="Graph training: JSONL of held-out Task records, or a function 'pkg.module:fn' returning them (instead of a split).")
    num_tasks: int = Field(8, ge=1, description="Held-out tasks, the same ones at every evaluation.")
    group_size: int = Field(1, ge=1, description="Episodes per held-out task.")
    every: int = Field(1, ge=1, description="Updates between evaluations.")
    at_start: bool = Field(True, description="Also evaluate the initial policy (0 updates).")
    temperature: float = Field(0.0, ge=0, description="0: greedy.")


class TrainConfig(BaseModel):
    """`seed-agents train`: SEED (or an ablation) on an env suite or any graph."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("textworld", description="Environment suite (entry point group seed_agents.envs).")
    split: str = Field("train", description="Training task split.")
    num_tasks: int = Field(8, ge=1, description="Distinct training tasks cycled through.")
    tasks_per_iteration: int = Field(2, ge=1, description="Tasks per update (paper: 16).")
    iterations: int = Field(3, ge=1, description="Optimizer updates (paper: 150).")
    seed: int = Field(0, description="Seed of everything.")
    out: Path = Field(Path("runs/train"), description="Run directory.")
    # Defaults are the embedded CPU demo (configs/textworld_smollm2_cpu.yaml); the paper's
    # settings are `--preset paper` (configs/paper.yaml). Instances, so `--help` shows them.
    backend: BackendConfig = BackendConfig()
    # the training temperature is this command's default, not SamplingParams' (1.0, what serving samples at)
    sampling: SamplingParams = Field(SamplingParams(max_tokens=16, temperature=0.5), json_schema_extra={"defaults": {
        "temperature": because("At 0.5 the atlas tasks sat in the learnable band, with more training successes and "
                               "fewer groups without reward variance than at 0.7, and every curve that met its goal "
                               "sampled there.", TEMPERATURE_BAND)}})
    runner: RunnerConfig = RunnerConfig(group_size=4)
    agent: AgentConfig = AgentConfig(max_turns=3, history="chat")
    skills: SkillConfig = SkillConfig(max_tokens=128)
    trainer: TrainerConfig = TrainerConfig()
    sync: Literal["auto", "full", "lora"] = Field("auto", description="vLLM weight sync; auto: lora when trainer.lora_r is set, else full.")
    env_options: dict[str, Any] = Field({}, description="Extra keyword arguments for the env suite.")
    graph: GraphConfig | None = Field(None, description="Train this graph on these tasks instead of the env suite.")
    store: StoreSourceConfig | None = Field(None, description="Train on recorded sessions from a trace store instead of playing episodes (`--from-store URL`).")
    stage1: Stage1Config = Stage1Config()
    eval: PeriodicEvalConfig | None = Field(None, description="Held-out evaluation during training (eval.jsonl); off when absent.")

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.tasks_per_iteration > self.num_tasks:
            raise ValueError(f"tasks_per_iteration ({self.tasks_per_iteration}) exceeds num_tasks ({self.num_tasks})")
        if self.runner.group_size < 2:
            raise ValueError("runner.group_size must be >= 2: group-relative advantages need a group")
        if self.sync == "lora" and self.trainer.lora_r is None:
            raise ValueError("sync: lora needs trainer.lora_r")
        if self.store is not None and self.trainer.guide_share != "auto" and self.trainer.guide_share:
            raise ValueError("trainer.guide_share needs episodes played here; stored sessions were played already")
        if self.store is not None and self.trainer.guide_share == "auto":  # nothing is played here: auto guides none
            self.trainer = self.trainer.model_copy(update={"guide_share": 0.0})
        if self.skills.failures == "auto":  # what a run records is what it did
            failures = "skip" if self.graph is not None or self.store is not None else "write"
            self.skills = self.skills.model_copy(update={"failures": failures})
        if self.store is not None and self.skills.source not in ("self", "external", "frozen", "none"):
            raise ValueError(f"skills.source {self.skills.source!r} cannot run on stored sessions; use self, external, frozen or none")
        if self.skills.source == "rule_based" and self.graph is not None:  # the env's offline analyzer: checked when it loads
            raise ValueError("skills.source: rule_based is an env suite's offline analyzer, and a graph has no env suite; "
                             "use self, external or frozen")
        if self.eval is not None:
            if self.graph is not None and self.eval.tasks is None:
                raise ValueError("eval: graph training needs eval.tasks (a JSONL of held-out tasks)")
            if self.graph is None and self.eval.split == self.split:
                raise ValueError(f"eval.split must differ from the training split ({self.split!r}): evaluate on held-out tasks")
        return self


def agent_fields_given(cfg: EvalConfig | TrainConfig) -> set[str]:
    """The agent fields the user set (YAML or flags); the rest may take suite defaults."""
    return set(cfg.agent.model_fields_set) if "agent" in cfg.model_fields_set else set()


def with_suite_defaults(agent: AgentConfig, defaults: dict[str, Any] | None, given: set[str]) -> AgentConfig:
    """The agent config with an env suite's protocol defaults (``suite.agent_defaults``,
    e.g. ALFWorld's 30 turns and window 5) for every field not in ``given``, the fields
    the user set. Without suite defaults the config is returned unchanged."""
    if not defaults:
        return agent
    return AgentConfig.model_validate({**agent.model_dump(), **{k: v for k, v in defaults.items() if k not in given}})
