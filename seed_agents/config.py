"""Typed configs, one per concern, composed. Field descriptions are the CLI help:
``seed-agents eval`` and ``train`` generate their flags from these models (``seed_agents.cli``).

The paper's coefficients live here once (``PAPER``), torch-free, so the configs, the pure
loss functions (``seed_agents.distill``) and the TRL config (``trainers.seed_trainer``) all
read the same numbers.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from seed_agents.runner import RunnerConfig
from seed_agents.types import SamplingParams


@dataclass(frozen=True)
class SEEDCoefficients:
    """Coefficients of the SEED objective (``seed_agents.distill.seed_objective``); the
    defaults are the paper's. ``lam=0`` is plain GRPO.

    ``gate_sharpness`` scales the OPD gate ``sigmoid(gate_sharpness * (l_skill - l_theta))``;
    the paper calls it beta, a name TRL already gives the KL coefficient (``kl`` here)."""

    clip_eps: float = 0.2
    entropy: float = 0.001
    lam: float = 0.01
    kl: float = 0.01
    gate_sharpness: float = 5.0


PAPER = SEEDCoefficients()
PAPER_LEARNING_RATE = 1e-6
"""The paper's RL learning rate (its SFT stage uses 5e-6)."""


class BackendConfig(BaseModel):
    """Which model serves the agent, and how to reach it."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "vllm"] = Field("local", description="local: transformers in-process; vllm: a running vLLM server.")
    model: str = Field("smollm2-135m", description="Alias (smollm2-135m), local folder or hub id; for vllm, the served model name.")
    tokenizer: str | None = Field(None, description="Tokenizer path/alias; defaults to `model` (with vllm, set it when the served name is not a local path).")
    weights: str | None = Field(None, description="Training only: local copy of the served weights (vllm); defaults to `tokenizer`, then `model`.")
    base_url: str = Field("http://127.0.0.1:8000", description="vLLM server URL (kind=vllm).")
    max_concurrency: int = Field(32, ge=1, le=4096, description="Requests in flight to the server.")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout.")
    max_retries: int = Field(3, ge=0, le=20, description="Retries on connection errors, timeouts and 5xx.")
    max_batch_size: int = Field(8, ge=1, le=1024, description="Local backend: requests batched into one generate call.")
    reload_method: Literal["seed_reload_weights", "reload_weights"] = Field("seed_reload_weights", description="vLLM full sync RPC: seed_reload_weights needs our worker extension (`seed-agents serve` loads it; exact for tied embeddings); reload_weights for a plain `vllm serve`.")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise ValueError("has a port that is not a number (e.g. http://127.0.0.1:8000)") from None
        return url


class AgentConfig(BaseModel):
    """Options of the env agent graph."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(10, ge=1, le=1000, description="Agent turns per episode.")
    history: Literal["window", "chat"] = Field("window", description="window: fresh prompt with recent turns; chat: one growing chat.")
    history_window: int = Field(5, ge=0, le=100, description="Past (observation, action) pairs shown in window mode.")


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


class UserError(Exception):
    """A problem the user can fix (input, paths, a server to start). The CLI prints its
    message as one line, naming the problem and the fix, and exits with ``exit_code``;
    a traceback only with ``seed-agents --debug``. Subclass it (with the builtin base the
    callers expect) for errors that should read this way."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """One clear message for a bad config, whatever its source (CLI flag or YAML)."""


def validation_message(err: ValidationError, source: str = "config", model: type[BaseModel] | None = None) -> str:
    """Every problem of ``err`` on one line: ``field: message (got value)``, with a
    "did you mean" for a misspelt key when ``model`` says which keys exist."""
    parts = []
    for problem in err.errors():
        loc = tuple(str(x) for x in problem["loc"])
        msg = problem["msg"].removeprefix("Value error, ")
        got = problem.get("input")
        part = f"{'.'.join(loc)}: {msg}" if loc else msg
        if problem["type"] == "extra_forbidden":
            close = _close_keys(model, loc)
            part += f" (did you mean {' or '.join(repr(k) for k in close)}?)" if close else ""
        elif got is not None and not isinstance(got, dict | list):
            part += f" (got {got!r})"
        parts.append(part)
    fix = "fix the flag" if source == "arguments" else "fix the file or the flag that overrides it"
    return f"invalid {source}: " + "; ".join(" ".join(p.split()) for p in parts) + f"; {fix} (see --help)"


def first_error(err: Exception) -> str:
    """A short one-line reason for a record that did not parse (pydantic's own text spans
    several lines and ends with a URL)."""
    if isinstance(err, ValidationError) and err.errors():
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
        return f"{loc + ': ' if loc else ''}{first['msg']}{more}"
    return " ".join(str(err).split())


def _close_keys(model: type[BaseModel] | None, loc: tuple[str, ...]) -> list[str]:
    """Field names of the (nested) model at ``loc[:-1]`` that look like ``loc[-1]``."""
    import difflib
    import typing

    for name in loc[:-1]:
        if model is None:
            return []
        field = model.model_fields.get(name)
        if field is None:
            return []
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    if model is None or not loc:
        return []
    return difflib.get_close_matches(loc[-1], list(model.model_fields), n=2, cutoff=0.6)


class SkillConfig(BaseModel):
    """Where hindsight skills come from and how they enter the teacher prompt."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["self", "external", "frozen", "rule_based", "none"] = Field("self", description="self: SEED; none: plain GRPO; external: another model writes skills (OPID-style); frozen: the initial policy, never synced; rule_based: the env suite's offline analyzer (EnvSuite.offline_analyzer: skills read off the trajectory, an ablation).")
    injector: Literal["system", "task_line"] = Field("system", description="system: a delimited block in the system message; task_line: after 'Your task is to:' (ALFWorld).")
    min_words: int = Field(5, ge=1, description="Shorter skills are rejected.")
    max_words: int = Field(120, ge=5, description="Longer skills are rejected.")
    max_tokens: int = Field(256, ge=16, le=8192, description="Analyzer completion budget.")
    analyzer: BackendConfig | None = Field(None, description="Backend of the external/frozen analyzer (default: a local copy of the initial policy).")


class RenamedConfigKey(FutureWarning):
    """A config key that still loads under its old name; the CLI shows it as one line."""


ReportTo = Literal["azure_ml", "clearml", "codecarbon", "comet_ml", "dagshub", "dvclive", "flyte", "kubeflow", "mlflow",
                   "neptune", "swanlab", "tensorboard", "trackio", "wandb"]
"""The integrations transformers' ``report_to`` knows (tests/unit/test_report_to.py checks them
against transformers' own table); each needs its package installed (checked before a run)."""


class TrainerConfig(BaseModel):
    """Optimization; names follow TRL's GRPOConfig where they exist."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(PAPER_LEARNING_RATE, gt=0, le=1.0, description="Paper: 1e-6 (use larger for tiny CPU demos).")
    opd_coef: float = Field(PAPER.lam, ge=0, description="lambda, the weight of the gated OPD term; 0 turns SEED into GRPO.")
    gate_sharpness: float = Field(PAPER.gate_sharpness, gt=0, description="Sharpness of the OPD gate sigmoid(s * (teacher - student logprob)); the paper's beta (formerly opd_beta).")
    kl_coef: float = Field(PAPER.kl, ge=0, description="KL(pi || pi_ref) coefficient (TRL's beta).")
    entropy_coef: float = Field(PAPER.entropy, ge=0, description="Entropy bonus.")
    clip_eps: float = Field(PAPER.clip_eps, gt=0, lt=1, description="PPO clip range.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping.")
    advantage_norm: Literal["mean_std", "mean"] = Field("mean_std", description="Group advantage normalization.")
    merge_rows: bool = Field(True, description="Merge calls whose tokens continue into one row.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in backward: less memory for a little more compute (SmolLM2 iteration on 2 cores, bench/update_memory.py: peak RSS 11.2 -> 7.3 GB at about the same update time, docs/results/update_memory.json; TRL's default is on too).")
    lora_r: int | None = Field(None, ge=1, le=512, description="Train a LoRA adapter of this rank instead of full weights.")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha.")
    report_to: list[ReportTo] = Field([], description="Where TRL also sends the training metrics (loss/ppo, loss/opd, opd/gate, success_rate, ...): tensorboard writes <out>/checkpoints/runs/; wandb, mlflow, trackio ... read their usual environment variables. metrics.jsonl is always written.")

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


class GraphConfig(BaseModel):
    """Train any LangGraph graph, not only an env suite: a builder, tasks and a reward."""

    model_config = ConfigDict(extra="forbid")

    build: str = Field(description="Import path 'pkg.module:fn'; fn(chat_model) returns a compiled graph.")
    tasks: Path = Field(description="JSONL file, one Task per line ({'task_id': ..., 'data': {...}}).")
    reward: str = Field(description="Import path of reward(task, final_state) -> float; success is reward >= 1.")
    input: Literal["task", "messages"] = Field("task", description="Graph input: {'task': Task}, or also {'messages': [user: task.data['question']]} (prebuilt agents).")


class Stage1Config(BaseModel):
    """Stage 1 before RL: SEED needs a policy that can already write parsable skills (the
    paper's ablation: 91.8 with stage 1, 86.0 without). With ``run: auto``, a SEED run
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
    cache_dir: Path | None = Field(None, description="Where stage-1 models are cached (default: $SEED_AGENTS_CACHE/stage1).")


class StoreSourceConfig(BaseModel):
    """Train on a deployed agent's recorded sessions (``train --from-store URL``) instead of
    playing episodes: each task key with at least two rewarded, unconsumed, unflagged
    sessions is a task, and its sessions are the GRPO group. Every session is claimed by
    exactly one update (``trainers.store_rollout``)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Trace store URL: sqlite:///path/traces.db or postgresql://user@host/db.")
    precedence: list[str] = Field(["verifier", "user", "judge"], description="Reward sources, most trusted first: the first source a session has sets its reward.")
    combine: Literal["first", "mean", "last"] = Field("first", description="How several rewards of the chosen source merge.")


class PeriodicEvalConfig(BaseModel):
    """Held-out evaluation during training: greedy episodes on tasks never trained on,
    before the first update and every ``every`` updates (and after the last one)."""

    model_config = ConfigDict(extra="forbid")

    split: str = Field("eval_seen", description="Env suite split to evaluate on (never the training split).")
    tasks: Path | None = Field(None, description="Graph training: JSONL of held-out Task records (instead of a split).")
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
    # settings are in configs/paper_textworld_qwen2.5-3b.yaml. Instances, so `--help` shows them.
    backend: BackendConfig = BackendConfig()
    sampling: SamplingParams = SamplingParams(max_tokens=16, temperature=0.7)
    runner: RunnerConfig = RunnerConfig(group_size=4)
    agent: AgentConfig = AgentConfig(max_turns=3, history="chat")
    skills: SkillConfig = SkillConfig(max_tokens=128)
    trainer: TrainerConfig = TrainerConfig(learning_rate=1e-5)
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


def load_config(model: type[BaseModel], path: str | Path | None, overrides: dict[str, Any]) -> Any:
    """Defaults < YAML file (optional) < ``overrides`` -> validated config, or one ConfigError.

    ``overrides`` are the command-line flags: dotted keys (``{"runner.group_size": 2}``) or
    nested mappings (``{"runner": {"group_size": 2}}``, what the generated CLI gives), merged
    into the file key by key; None means "not given"."""
    import yaml

    raw: dict[str, Any] = {}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as err:
            raise ConfigError(f"cannot read config {path}: {err.strerror or err}; check the --config path") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ConfigError(f"{path} is not valid YAML{where}: {problem}; fix the file") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys at the top level, got {type(raw).__name__}; "
                              f"write `key: value` lines")
    _merge(raw, overrides, path)
    _keep_command_defaults(model, raw)
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(validation_message(err, str(path) if path else "arguments", model)) from None


def _merge(into: dict[str, Any], overrides: dict[str, Any], path: str | Path | None) -> None:
    """Set every non-None value of ``overrides`` in ``into`` (in place), one key at a time."""
    for dotted, value in overrides.items():
        value = _given(value)
        if value is None:
            continue
        section = into
        *parents, leaf = dotted.split(".")
        for name in parents:
            child = section.setdefault(name, {})
            if not isinstance(child, dict):  # e.g. `runner: 3` in the YAML, then --group
                raise ConfigError(f"{path}: {name} must be a mapping of its fields, got {child!r}; fix the file")
            section = child
        if isinstance(value, dict) and isinstance(section.get(leaf), dict):
            _merge(section[leaf], value, path)
        elif isinstance(value, dict) and leaf in section and section[leaf] is not None:
            raise ConfigError(f"{path}: {leaf} must be a mapping of its fields, got {section[leaf]!r}; fix the file")
        else:
            section[leaf] = value


def _keep_command_defaults(model: type[BaseModel], raw: dict[str, Any]) -> None:
    """A section given in part keeps the command's own defaults for the rest (in place).

    Commands set some sections' defaults themselves (``EvalConfig.sampling`` is
    ``SamplingParams(max_tokens=24, ...)``, not the class default 64); without this, one
    field given (``--temperature 0.3``) would rebuild the section from its class and
    silently change the others. ``agent`` is left alone: its unset fields take the env
    suite's protocol defaults (``with_suite_defaults``), which need to see what was given."""
    for name, field in model.model_fields.items():
        section = raw.get(name)
        if name == "agent" or not isinstance(section, dict) or not isinstance(field.default, BaseModel):
            continue
        raw[name] = {**field.default.model_dump(exclude_unset=True), **section}


def _given(value: Any) -> Any:
    """``value`` without its None entries and the sections left empty: None (not given) or
    an empty section would replace a default section (``TrainConfig.skills`` is not
    ``SkillConfig()``)."""
    if not isinstance(value, dict):
        return value
    kept = {key: pruned for key, item in value.items() if (pruned := _given(item)) is not None}
    return kept or None
