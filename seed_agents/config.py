"""Typed configs, one per concern, composed. Field descriptions are the CLI help."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from seed_agents.runner import RunnerConfig
from seed_agents.types import SamplingParams


class BackendConfig(BaseModel):
    """Which model serves the agent, and how to reach it."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "vllm"] = Field("local", description="local: transformers in-process; vllm: a running vLLM server.")
    model: str = Field("smollm2-135m", description="Alias (smollm2-135m), local folder or hub id; for vllm, the served model name.")
    tokenizer: str | None = Field(None, description="Tokenizer path/alias; defaults to `model` (with vllm, set it when the served name is not a local path).")
    base_url: str = Field("http://127.0.0.1:8000", description="vLLM server URL (kind=vllm).")
    max_concurrency: int = Field(32, ge=1, le=4096, description="Requests in flight to the server.")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout.")
    max_retries: int = Field(3, ge=0, le=20, description="Retries on connection errors, timeouts and 5xx.")
    max_batch_size: int = Field(8, ge=1, le=1024, description="Local backend: requests batched into one generate call.")


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
    split: str = Field("eval_seen", description="Task split to play.")
    episodes: int = Field(8, ge=1, le=100000, description="Total episodes = tasks x group; must be a multiple of group.")
    seed: int = Field(0, description="Seed for sampling and env shuffles.")
    out: Path = Field(Path("runs/eval"), description="Output directory.")
    backend: BackendConfig = Field(default_factory=BackendConfig)
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(max_tokens=24, temperature=0.7))
    runner: RunnerConfig = Field(default_factory=lambda: RunnerConfig(group_size=1))
    agent: AgentConfig = Field(default_factory=AgentConfig)
    env_options: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for the env suite.")

    @model_validator(mode="after")
    def _groups(self) -> EvalConfig:
        g = self.runner.group_size
        if self.episodes % g:
            raise ValueError(f"episodes ({self.episodes}) must be a multiple of group ({g})")
        return self

    @property
    def num_tasks(self) -> int:
        return self.episodes // self.runner.group_size


class ConfigError(ValueError):
    """One clear message for a bad config, whatever its source (CLI flag or YAML)."""


def validation_message(err: ValidationError, source: str = "config") -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(root)"
        parts.append(f"  {loc}: {e['msg']}" + (f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""))
    return f"invalid {source}:\n" + "\n".join(parts)
