"""The core's configs: which backend serves the model, how episodes are scheduled, how the
env agent plays, and the paper's SEED coefficients.

They live below everything that uses them (the runner, the backends, the app's command
configs) and import nothing of the project but ``seed_agents.types`` (and the warning class of
``seed_agents.config.loading``), so any module may read them without pulling in LangGraph, torch
or the CLI. Field descriptions are the CLI help.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from seed_agents.config.loading import RenamedConfigKey
from seed_agents.types import SamplingParams

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_name(name: str) -> str:
    """An environment variable's NAME (configs name where a secret lives, never hold it);
    a string that looks like a pasted key is refused without being echoed."""
    if not _ENV_NAME.fullmatch(name):
        raise ValueError("not an environment variable name; give the NAME of the variable, not its value")
    return name


__all__ = ["AUTO_GUIDE_SHARE", "LOCAL_ENGINE_KEYS", "PAPER", "PAPER_LEARNING_RATE", "PAPER_SFT_LEARNING_RATE", "AgentConfig", "BackendConfig", "RunnerConfig", "SEEDCoefficients", "SamplingParams",
           "check_env_name"]


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
"""The paper's RL learning rate."""
PAPER_SFT_LEARNING_RATE = 5e-6
"""The paper's stage-1 SFT learning rate."""

AUTO_GUIDE_SHARE = 0.5
"""The share of each group that ``trainer.guide_share: auto`` guides, in episodes whose first
policy call is free to call a bound tool (the share the guided-openings curve learned with)."""


#: Switches of the local backend kept out of the user config, at the one value every command
#: runs. Each computes the same tokens a simpler, slower way (every prompt whole, one
#: prefix a batch, transformers' own cache, ``generate``); the local backend is the reference
#: engine, and a user needs only its default. Benchmarks that time the simpler ways set them
#: (``seed_agents.backends.engine.LocalEngineOptions``, which has these defaults). A config that
#: names one at this value loads with a warning; at another, it is refused with one line.
LOCAL_ENGINE_KEYS: dict[str, Any] = {"reuse_kv": True, "prefix_groups": True, "kv_cache": "dynamic", "drop_finished": True}


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def retired_engine_keys(given: dict[str, Any]) -> tuple[str | None, str | None]:
    """The ``LOCAL_ENGINE_KEYS`` a backend section ``given`` still names, as (error, notice): an
    error line where one asks for another value than the engine runs, else a notice line
    when any is named (the keys are then ignored); each None when there is none."""
    named = [key for key in LOCAL_ENGINE_KEYS if key in given]
    other = [key for key in named if given[key] != LOCAL_ENGINE_KEYS[key]]
    if other:
        asked = ", ".join(f"{key} {_shown(given[key])}" for key in other)
        runs = ", ".join(f"{key} {_shown(LOCAL_ENGINE_KEYS[key])}" for key in other)
        return (f"{asked}: removed from the user config (an older, slower path of the local backend, which always "
                f"runs {runs}; benchmarks set it through SEED_AGENTS_BENCH_LOCAL_ENGINE)"), None
    if named:
        runs = ", ".join(f"{key} {_shown(LOCAL_ENGINE_KEYS[key])}" for key in named)
        return None, (f"backend {', '.join(named)}: {'no longer settings' if len(named) > 1 else 'no longer a setting'} "
                      f"(the local backend always runs {runs}); ignored, remove {'them' if len(named) > 1 else 'it'}")
    return None, None


class BackendConfig(BaseModel):
    """Which model serves the agent, and how to reach it."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "vllm"] = Field("local", description="local: transformers in the command's own process; vllm: a vLLM server (base_url, or one the command starts).")
    model: str = Field("smollm2-135m", description="Alias (smollm2-135m), local folder or hub id; for vllm, the served model name.")
    tokenizer: str | None = Field(None, description="Tokenizer path/alias; defaults to `model` (with vllm, set it when the served name is not a local path).")
    weights: str | None = Field(None, description="Training only: local copy of the served weights (vllm); defaults to `tokenizer`, then `model`.")
    base_url: str | None = Field(None, description="kind=vllm: the URL of a running vLLM server (`seed-agents serve` starts one); unset, the command starts a server of its own and stops it when it ends.")
    api_key_env: str = Field("SEED_AGENTS_VLLM_API_KEY", description="kind=vllm: environment variable holding the server's API key, sent as a bearer token on every request (unset variable: no key). Only the name is configured; the key never reaches a file.")
    max_concurrency: int = Field(32, ge=1, le=4096, description="Requests in flight to the server.")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout.")
    max_retries: int = Field(3, ge=0, le=20, description="Retries on connection errors, timeouts and 5xx.")
    max_batch_size: int = Field(32, ge=1, le=1024, description="Local backend: requests batched into one generate call; 32 holds a 4 x 8 iteration's calls in one batch (docs/benchmarks.md#the-engine-for-a-whole-iteration).")
    precision: Literal["auto", "float32", "bfloat16"] = Field("auto", description=(
        "The number format the local backend samples and the trainer updates in (stage 1 too). auto: "
        "bfloat16 where the hardware has it, else float32 (docs/training.md, Precision); float32 for "
        "exact logprobs."))
    attention: Literal["auto", "same", "float32"] = Field("auto", description=(
        "Under bfloat16, attention's format: float32 runs it in fp32 over the bf16 products, same keeps "
        "bf16. auto: float32 on a CPU without AMX, else same (docs/training.md, Precision)."))
    reload_method: Literal["seed_reload_weights", "reload_weights"] = Field("seed_reload_weights", description="vLLM full sync RPC: seed_reload_weights needs our worker extension (`seed-agents serve` loads it; exact for tied embeddings); reload_weights for a plain `vllm serve`.")

    @model_validator(mode="before")
    @classmethod
    def _retired_engine_keys(cls, data: Any) -> Any:
        """An old config's local-engine switch (``LOCAL_ENGINE_KEYS``): one line, never a traceback."""
        if not isinstance(data, dict) or not LOCAL_ENGINE_KEYS.keys() & data.keys():
            return data
        error, notice = retired_engine_keys(data)
        if error is not None:
            raise ValueError(error)
        warnings.warn(str(notice), RenamedConfigKey, stacklevel=2)
        return {key: value for key, value in data.items() if key not in LOCAL_ENGINE_KEYS}

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, name: str) -> str:
        return check_env_name(name)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        from urllib.parse import urlsplit

        if url is None:
            return None

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


class RunnerConfig(BaseModel):
    """How episodes are scheduled."""

    model_config = {"extra": "forbid"}

    group_size: int = Field(1, ge=1, le=1024, description="Episodes per task (the GRPO group G).")
    concurrency: int = Field(32, ge=1, le=4096, description="Episodes in flight at once; 32 lets a 4 x 8 iteration's episodes batch together (docs/benchmarks.md#the-engine-for-a-whole-iteration).")
    episode_timeout_s: float = Field(600.0, gt=0, description="Wall-clock limit per episode.")
    recursion_limit: int = Field(1000, ge=10, description="LangGraph super-step limit per episode.")
    progress: bool = Field(True, description=(
        "Show a progress bar (continual: a bar per phase where stderr is a terminal, else one line per phase; off: "
        "lines only)."))
    max_fault_fraction: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Stop the run when more than this fraction of a batch's episodes (an iteration's or an eval's) "
        "end in an infrastructure fault. Faulted episodes are never trained on."))
