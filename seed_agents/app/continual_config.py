"""`seed-agents continual --config FILE`: one typed config, composed of the existing ones.

The model, sampling, skills and optimizer settings are ``seed_agents.config``'s (the same
fields as ``seed-agents train``); the tool API is ``seed_agents.tools.openapi.OpenAPIToolsConfig``,
the shadow replays' rules ``seed_agents.tools.replay.ReplayConfig`` and the gate ``GateConfig``.
What is new here: which sessions a cycle takes, how many replays make a group, and the
canary.

Sampling follows the deployment: ``sampling.max_tokens``, ``sampling.temperature``,
``agent.tool_choice`` (with ``tool_choice_turns``) and ``canary.temperature`` left out of
the config are each session's own, as the gateway recorded them
(``seed_agents.transcript.DeployedSampling``); the canary, which plays no session, takes
those of the cycle's sessions. Set, they win, and ``unlike_deployment`` names where they
differ from what the deployment sent (the loop prints it once, as a warning). Without a
record the defaults below apply, and ``max_tokens`` is the gateway's default, 512, so a
forced tool call the deployment finished is not cut in its replay.

Every section is typed, so a bad tools or replay section is one error when the config
loads, before the loop opens the store or plays anything. It lives in the app layer
because it composes the tools' own configs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from seed_agents.config import BackendConfig, RunnerConfig, SkillConfig, TrainerConfig
from seed_agents.continual.gate import GateConfig
from seed_agents.tools.openapi import OpenAPIToolsConfig
from seed_agents.tools.replay import ReplayConfig
from seed_agents.transcript import DeployedSampling
from seed_agents.types import SamplingParams

DEFAULT_SAMPLING = {"max_tokens": 512, "temperature": 0.7}
"""The loop's sampling where neither its config nor the session's record says: ``max_tokens``
as the gateway's ``default_max_tokens``."""
_CHOICES = ("auto", "none", "required", "any")


@dataclass(frozen=True)
class Play:
    """How one replay or canary episode samples: the config's settings, else the deployment's."""

    sampling: SamplingParams
    tool_choice: str
    tool_choice_turns: Literal["first", "every"]

    def tool_choices(self) -> dict[str, str | None]:
        """``build_tool_agent``'s keyword arguments for the tool choice."""
        return tool_choice_kwargs(self.tool_choice, self.tool_choice_turns)


def tool_choice_kwargs(choice: str, turns: str) -> dict[str, str | None]:
    """``build_tool_agent``'s keyword arguments for ``choice`` applied on ``turns`` (first or every)."""
    forced = None if choice == "auto" else choice
    return {"tool_choice": forced} if turns == "every" else {"first_tool_choice": forced}


class ToolAgentConfig(BaseModel):
    """The deployed agent as the loop replays it: ``seed_agents.graphs.tool_agent.build_tool_agent``
    over tools generated from the API's OpenAPI spec."""

    model_config = ConfigDict(extra="forbid")

    spec: str | None = Field(None, description="OpenAPI spec: a file or URL (default: <tools.base_url>/openapi.json).")
    tools: OpenAPIToolsConfig = Field(description="The tools generated from the spec (seed_agents.tools.openapi.OpenAPIToolsConfig): base_url (production), allow_hosts, allow_operations, auth, ...")
    system_prompt: str | None = Field(None, description="The agent's system message.")
    max_turns: int = Field(4, ge=1, le=100, description="Model turns per episode.")
    tool_choice: str = Field("auto", min_length=1, description=(
        "auto, none, required, or a tool (operation) name: a forced call. Unset: what each session's first call sent "
        "through the gateway (recorded), else auto."))
    tool_choice_turns: Literal["first", "every"] = Field("first", description=(
        "Where tool_choice applies: the first turn only (later turns answer or call freely), or every turn. "
        "Unset: as the session's calls sent it."))
    reward: str = Field(description=(
        "Import path of the reward: reward(task, state) -> float, or the gateway's verifier form "
        "fn(session, calls) -> float (adapted; see docs/deploy.md); success is reward >= 1."))

    def tool_choices(self) -> dict[str, str | None]:
        """``build_tool_agent``'s keyword arguments for ``tool_choice``."""
        return tool_choice_kwargs(self.tool_choice, self.tool_choice_turns)


class CanaryConfig(BaseModel):
    """The fixed canary set: the same tasks and seeds for the candidate and the promoted
    version, tools that never reach production."""

    model_config = ConfigDict(extra="forbid")

    tasks: Path = Field(description="JSONL of Task records ({'task_id': ..., 'data': {'question': ..., ...}}).")
    seeds: int = Field(2, ge=1, le=64, description="Episodes per task and version; episode k samples with seed k.")
    temperature: float = Field(0.7, ge=0, description=(
        "Sampling temperature of canary episodes (0: greedy). Unset: the deployment's, as the cycle's sessions recorded it."))
    sandbox_app: str | None = Field(None, description="Import path of an ASGI app factory (e.g. examples.library_service:create_app): every canary episode gets a fresh instance, in process.")
    recording: Path | None = Field(None, description="Without sandbox_app: a recording (tools.replay JSONL) that answers canary requests in replay mode; a request it lacks gets a 424.")
    replay_sandbox: bool = Field(False, description=(
        "Play canary episodes in shadow mode with the replay section's sandbox instead of sandbox_app (an"
        " API that is not an ASGI app). Reads `recording` when set, else live under the rate limit."))


class ContinualConfig(BaseModel):
    """`seed-agents continual`: claim rewarded sessions, replay them G times in shadow mode,
    train a LoRA candidate from the promoted version, gate it on the canary, promote or reject."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("policy", description="The model name agents call; the version registry resolves it to the promoted adapter.")
    store: str = Field(description="Trace store URL: sqlite:///path/traces.db or postgresql://user@host/db.")
    out: Path = Field(Path("runs/continual"), description="Adapters (adapters/cycle-<id>) and per-cycle traces (cycles/<id>/).")
    seed: int = Field(0, description="Seed of sampling and training.")
    backend: BackendConfig = Field(default_factory=BackendConfig, description="The base model; kind vllm: the server that serves every version (LoRA) and `model` is its base served name.")
    replicas: list[str] = Field(default_factory=list, description=(
        "kind vllm: the other vLLM replicas the gateways send to (base URLs), beside backend.base_url; "
        "each loads every version before its canary, which samples from backend.base_url."))
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(**DEFAULT_SAMPLING), description=(
        "Replay and canary sampling. max_tokens and temperature left unset: each session's own, as the gateway "
        "recorded it (else 512 and 0.7)."))
    skills: SkillConfig = Field(default_factory=lambda: SkillConfig(max_tokens=128))
    trainer: TrainerConfig = Field(default_factory=lambda: TrainerConfig(learning_rate=1e-4, lora_r=8, kl_coef=0.0), description="One optimizer step per cycle; lora_r is required.")
    runner: RunnerConfig = Field(default_factory=lambda: RunnerConfig(concurrency=4, episode_timeout_s=300.0), description=(
        "Episode scheduling; progress: a bar per phase (replays, canary) on a terminal, else one line per phase; "
        "progress off: lines only."))
    agent: ToolAgentConfig
    replay: ReplayConfig = Field(default_factory=lambda: ReplayConfig(mode="shadow"), description="How training replays treat the tools (seed_agents.tools.replay.ReplayConfig; mode must be shadow, the default here).")
    sessions_per_cycle: int = Field(4, ge=1, le=10_000, description="Rewarded sessions claimed per cycle: each one is a task replayed group_size times.")
    group_size: int = Field(4, ge=2, le=256, description="Shadow replays per session: the GRPO group G.")
    min_signal_groups: int = Field(1, ge=0, le=10_000, description=(
        "Train only when this many replay groups had unequal rewards; else the cycle is skipped (sessions without "
        "reward variance unusable, the rest queued again). 0: always train."))
    carry_optimizer: bool = Field(True, description=(
        "Keep each adapter's optimizer state and start the next cycle from the promoted adapter's, so "
        "cycles train like one run's steps. false: a fresh optimizer every cycle."))
    precedence: list[str] = Field(default_factory=lambda: ["verifier", "user", "judge"], description="Reward sources that make a session eligible, most trusted first.")
    ignore_unlisted: bool = Field(False, description="Only sessions rewarded by a source in precedence are taken.")
    canary: CanaryConfig
    gate: GateConfig = Field(default_factory=GateConfig)
    poll_s: float = Field(30.0, gt=0, description="Wait between checks while no session is waiting.")
    _explicit: frozenset[str] = PrivateAttr(default_factory=frozenset)

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
        explicit = {f"sampling.{k}" for k in DEFAULT_SAMPLING
                    if "sampling" in self.model_fields_set and k in self.sampling.model_fields_set}
        explicit |= {f"agent.{k}" for k in ("tool_choice", "tool_choice_turns") if k in self.agent.model_fields_set}
        explicit |= {"canary.temperature"} if "temperature" in self.canary.model_fields_set else set()
        self._explicit = frozenset(explicit)
        # a partial sampling section keeps the loop's defaults, not SamplingParams' own
        unset = {k: v for k, v in DEFAULT_SAMPLING.items() if f"sampling.{k}" not in explicit}
        if unset:
            self.sampling = self.sampling.model_copy(update=unset)
        return self

    def explicit(self, field: str) -> bool:
        """Whether the config (file or flag) set ``field`` (e.g. ``sampling.max_tokens``), rather than leaving it to
        the deployment's record."""
        return field in self._explicit

    def play(self, deployed: DeployedSampling | None, *, canary: bool = False, tools: Collection[str] = ()) -> Play:
        """How an episode samples: each setting the config sets, else the deployment's record
        (``deployed``; a tool_choice naming none of ``tools`` is not used), else the default.
        ``canary``: the temperature is ``canary.temperature``'s."""
        def pick(field: str, mine: Any, theirs: Any) -> Any:
            return mine if self.explicit(field) or deployed is None or theirs is None else theirs

        temperature = (pick("canary.temperature", self.canary.temperature, deployed and deployed.temperature) if canary
                       else pick("sampling.temperature", self.sampling.temperature, deployed and deployed.temperature))
        sampling = self.sampling.model_copy(update={
            "max_tokens": pick("sampling.max_tokens", self.sampling.max_tokens, deployed and deployed.max_tokens),
            "temperature": temperature})
        recorded = deployed.tool_choice if deployed is not None and _usable(deployed.tool_choice, tools) else None
        choice = pick("agent.tool_choice", self.agent.tool_choice, recorded)
        turns = pick("agent.tool_choice_turns", self.agent.tool_choice_turns,
                     deployed.tool_choice_turns if recorded is not None and deployed is not None else None)
        return Play(sampling=sampling, tool_choice=choice, tool_choice_turns=turns)

    def unlike_deployment(self, deployed: Iterable[DeployedSampling | None], *, tools: Collection[str] = ()) -> list[str]:
        """Where the settings this config sets differ from what the deployment sent (its
        sessions' records), and recorded tool choices the loop cannot send; one phrase each."""
        found: Counter[str] = Counter()
        for d in deployed:
            if d is None:
                continue
            for field, mine, theirs in (("sampling.max_tokens", self.sampling.max_tokens, d.max_tokens),
                                        ("sampling.temperature", self.sampling.temperature, d.temperature),
                                        ("canary.temperature", self.canary.temperature, d.temperature),
                                        ("agent.tool_choice", self.agent.tool_choice, d.tool_choice),
                                        ("agent.tool_choice_turns", self.agent.tool_choice_turns, d.tool_choice_turns)):
                if self.explicit(field) and theirs is not None and _same(mine) != _same(theirs):
                    found[f"{field} {mine} where the deployment sent {theirs}"] += 1
            if d.tool_choice is not None and not _usable(d.tool_choice, tools) and not self.explicit("agent.tool_choice"):
                found[f"the deployment forced {d.tool_choice!r}, not a tool of the loop's spec: agent.tool_choice "
                      f"{self.agent.tool_choice} instead"] += 1
        return list(found)

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


def _same(value: Any) -> Any:
    return "required" if value == "any" else value  # SeedChatModel's word for OpenAI's


def _usable(choice: str | None, tools: Collection[str]) -> bool:
    return choice is not None and (choice in _CHOICES or choice in tools)


def most_common(deployed: Iterable[DeployedSampling | None]) -> DeployedSampling | None:
    """The record most of a cycle's sessions share (the first of them at a tie): what the
    canary, which plays no session, samples with."""
    counts = Counter(d for d in deployed if d is not None)
    return max(counts, key=counts.__getitem__) if counts else None
