"""`seed-agents continual --config FILE`: one typed config, composed of the existing ones.

The model, sampling, skills and optimizer settings are ``seed_agents.config``'s (the same
fields as ``seed-agents train``); the tool API is ``seed_agents.tools.openapi.OpenAPIToolsConfig``,
the shadow replays' rules ``seed_agents.tools.replay.ReplayConfig`` and the gate ``GateConfig``.
What is new here: which sessions a cycle takes, how many replays make a group, and the
canary. Every section is typed, so a bad tools or replay section is one error when the
config loads, before the loop opens the store or plays anything. It lives in the app layer
because it composes the tools' own configs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from seed_agents.config import BackendConfig, RunnerConfig, SkillConfig, TrainerConfig
from seed_agents.continual.gate import GateConfig
from seed_agents.tools.openapi import OpenAPIToolsConfig
from seed_agents.tools.replay import ReplayConfig
from seed_agents.types import SamplingParams


class ToolAgentConfig(BaseModel):
    """The deployed agent as the loop replays it: ``seed_agents.graphs.tool_agent.build_tool_agent``
    over tools generated from the API's OpenAPI spec."""

    model_config = ConfigDict(extra="forbid")

    spec: str | None = Field(None, description="OpenAPI spec: a file or URL (default: <tools.base_url>/openapi.json).")
    tools: OpenAPIToolsConfig = Field(description="The tools generated from the spec (seed_agents.tools.openapi.OpenAPIToolsConfig): base_url (production), allow_hosts, allow_operations, auth, ...")
    system_prompt: str | None = Field(None, description="The agent's system message.")
    max_turns: int = Field(4, ge=1, le=100, description="Model turns per episode.")
    tool_choice: str = Field("auto", min_length=1, description=(
        "The tool_choice the deployed agent sends: auto, none, required, or an operation's tool name (a forced call, "
        "constrained as the gateway and SeedChatModel constrain it). Set it to what production sends, so the replayed "
        "agent is the deployed one."))
    tool_choice_turns: Literal["first", "every"] = Field("first", description=(
        "Where tool_choice applies: the first turn only (later turns answer or call freely), or every turn."))
    reward: str = Field(description=(
        "Import path of the reward: reward(task, state) -> float, or the gateway's verifier form "
        "fn(session, calls) -> float (adapted; see docs/deploy.md); success is reward >= 1."))

    def tool_choices(self) -> dict[str, str | None]:
        """``build_tool_agent``'s keyword arguments for ``tool_choice``."""
        choice = None if self.tool_choice == "auto" else self.tool_choice
        if self.tool_choice_turns == "every":
            return {"tool_choice": choice}
        return {"first_tool_choice": choice}


class CanaryConfig(BaseModel):
    """The fixed canary set: the same tasks and seeds for the candidate and the promoted
    version, tools that never reach production."""

    model_config = ConfigDict(extra="forbid")

    tasks: Path = Field(description="JSONL of Task records ({'task_id': ..., 'data': {'question': ..., ...}}).")
    seeds: int = Field(2, ge=1, le=64, description="Episodes per task and version; episode k samples with seed k.")
    temperature: float = Field(0.7, ge=0, description="Sampling temperature of canary episodes (0: greedy).")
    sandbox_app: str | None = Field(None, description="Import path of an ASGI app factory (e.g. examples.library_service:create_app): every canary episode gets a fresh instance, in process.")
    recording: Path | None = Field(None, description="Without sandbox_app: a recording (tools.replay JSONL) that answers canary requests in replay mode; a request it lacks gets a 424.")
    replay_sandbox: bool = Field(False, description="Instead of sandbox_app: play canary episodes in shadow mode with the replay section's sandbox (a sandbox_base_url is reset before every episode, a replay.sandbox_app is fresh); reads from `recording` when set, else live under the rate limit. For an API that is not an ASGI app.")


class ContinualConfig(BaseModel):
    """`seed-agents continual`: claim rewarded sessions, replay them G times in shadow mode,
    train a LoRA candidate from the promoted version, gate it on the canary, promote or reject."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("policy", description="The model name agents call; the version registry resolves it to the promoted adapter.")
    store: str = Field(description="Trace store URL: sqlite:///path/traces.db or postgresql://user@host/db.")
    out: Path = Field(Path("runs/continual"), description="Adapters (adapters/cycle-<id>) and per-cycle traces (cycles/<id>/).")
    seed: int = Field(0, description="Seed of sampling and training.")
    backend: BackendConfig = Field(default_factory=BackendConfig, description="The base model; kind vllm: the server that serves every version (LoRA) and `model` is its base served name.")
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(max_tokens=64, temperature=0.7), description="Replay sampling.")
    skills: SkillConfig = Field(default_factory=lambda: SkillConfig(max_tokens=128))
    trainer: TrainerConfig = Field(default_factory=lambda: TrainerConfig(learning_rate=1e-4, lora_r=8, kl_coef=0.0), description="One optimizer step per cycle; lora_r is required.")
    runner: RunnerConfig = Field(default_factory=lambda: RunnerConfig(concurrency=4, episode_timeout_s=300.0, progress=False))
    agent: ToolAgentConfig
    replay: ReplayConfig = Field(default_factory=lambda: ReplayConfig(mode="shadow"), description="How training replays treat the tools (seed_agents.tools.replay.ReplayConfig; mode must be shadow, the default here).")
    sessions_per_cycle: int = Field(4, ge=1, le=10_000, description="Rewarded sessions claimed per cycle: each one is a task replayed group_size times.")
    group_size: int = Field(4, ge=2, le=256, description="Shadow replays per session: the GRPO group G.")
    carry_optimizer: bool = Field(True, description=(
        "Keep the optimizer's state (Adam's moments and step count) with each adapter and start the next cycle's "
        "step from the promoted adapter's, so cycles train as the steps of one run do; off: every cycle's step is "
        "a fresh optimizer's first, which with Adam moves every weight by about the learning rate."))
    precedence: list[str] = Field(default_factory=lambda: ["verifier", "user", "judge"], description="Reward sources that make a session eligible, most trusted first.")
    ignore_unlisted: bool = Field(False, description="Only sessions rewarded by a source in precedence are taken.")
    canary: CanaryConfig
    gate: GateConfig = Field(default_factory=GateConfig)
    poll_s: float = Field(30.0, gt=0, description="Wait between checks while no session is waiting.")

    @field_validator("replay", mode="before")
    @classmethod
    def _shadow_by_default(cls, value: Any) -> Any:
        """A replay section without ``mode`` means shadow here (``ReplayConfig``'s own default is not)."""
        return {"mode": "shadow", **value} if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _consistent(self) -> ContinualConfig:
        if self.trainer.guide_share == "auto":  # served traffic is never steered: auto guides none here
            self.trainer = self.trainer.model_copy(update={"guide_share": 0.0})
        if self.trainer.guide_share:
            raise ValueError("trainer.guide_share is for `seed-agents train`: the loop trains on served traffic, "
                             "which must not be steered")
        if self.trainer.lora_r is None:
            raise ValueError("trainer.lora_r is required: the loop trains LoRA candidates (one adapter per version)")
        if self.replay.mode != "shadow":
            raise ValueError("replay.mode must be shadow: training replays never send a write to production")
        if self.skills.source not in ("self", "none"):
            raise ValueError("skills.source must be self (SEED) or none (GRPO) in the continual loop")
        if self.canary.replay_sandbox:
            if self.canary.sandbox_app is not None:
                raise ValueError("canary.replay_sandbox and canary.sandbox_app are two sandboxes: set one")
            if self.replay.sandbox_base_url is None and self.replay.sandbox_app is None:
                raise ValueError("canary.replay_sandbox needs a sandbox in the replay section "
                                 "(replay.sandbox_base_url with sandbox_reset, or replay.sandbox_app)")
            if self.replay.sandbox_base_url is not None and self.replay.sandbox_reset is None:
                raise ValueError("canary.replay_sandbox with replay.sandbox_base_url needs replay.sandbox_reset: "
                                 "every canary episode must start from the same sandbox state")
        return self

    def train_fields(self, out: Path, n_groups: int) -> dict[str, Any]:
        """The ``seed_agents.config.TrainConfig`` of one cycle's update, so the loop reuses
        the train command's builders (``seed_agents.app.policy``: model, LoRA, backend, TRL
        arguments) as they are."""
        return {
            "out": out, "seed": self.seed, "iterations": 1, "num_tasks": n_groups, "tasks_per_iteration": n_groups,
            "backend": self.backend.model_dump(), "sampling": self.sampling.model_dump(),
            "runner": {**self.runner.model_dump(), "group_size": self.group_size},
            "skills": self.skills.model_dump(), "trainer": self.trainer.model_dump(),
            "sync": "lora", "stage1": {"run": "off"},
        }

