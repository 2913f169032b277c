"""The builders every command shares: a backend and its chat model, the agent's options, tasks.

``eval``, ``train``, ``continual`` and the stage-1 commands open their model through
``open_backend``/``open_chat_model`` (a vLLM server must answer ``/health`` before any
episode is played), so the set-up lives once. Nothing here imports the trainer stack:
``seed-agents eval`` never pays for TRL.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from seed_agents.backends import BackendUnavailable, make_backend
from seed_agents.chat_model import SeedChatModel
from seed_agents.config import (
    AgentConfig,
    BackendConfig,
    EvalConfig,
    TrainConfig,
    agent_fields_given,
    first_error,
    with_suite_defaults,
)
from seed_agents.envs import EnvSuite
from seed_agents.errors import ConfigError
from seed_agents.types import SamplingParams, Task

_TASKS_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def read_tasks(path: Path | str) -> list[Any]:
    """The tasks of a JSONL file (one Task record a line), or of a function named by import
    path (``pkg.module:fn``, called with no argument) where no such file exists: a task
    family that ships inside a package has its tasks without a data file beside it."""
    if not Path(path).exists() and _TASKS_FUNCTION.fullmatch(str(path)):
        return _tasks_from_function(str(path))
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ConfigError(f"cannot read tasks file {path}: {err.strerror or err}; check the tasks path in the config") from None
    tasks = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                tasks.append(Task.model_validate_json(line))
            except ValueError as err:
                raise ConfigError(f"{path}:{number}: not a Task record ({first_error(err)}); write one JSON object per "
                                  f"line: {{\"task_id\": ..., \"data\": {{...}}}}") from None
    if not tasks:
        raise ConfigError(f"{path} holds no tasks; write one Task record per line")
    return tasks


def _tasks_from_function(spec: str) -> list[Task]:
    from seed_agents.imports import load_object

    try:
        made = load_object(spec)()
        tasks = [t if isinstance(t, Task) else Task.model_validate(t) for t in made]
    except (ValueError, TypeError) as err:
        raise ConfigError(f"tasks {spec!r}: {first_error(err)}; name a JSONL file "
                          f"or a function 'pkg.module:fn' that returns Task records") from None
    if not tasks:
        raise ConfigError(f"tasks {spec!r} returned no tasks")
    return tasks


def rollout_seed(seed: int, backend: BackendConfig) -> int | None:
    """The runner seed that makes rollouts reproducible (``EpisodeRunner(seed=)``): the
    run's seed on the local backend; None on vLLM, whose 0.32 CPU build crashes on
    concurrent seeded requests (docs/reproducibility.md)."""
    return seed if backend.kind == "local" else None


def agent_config(cfg: EvalConfig | TrainConfig, suite: EnvSuite | None) -> AgentConfig:
    """The agent options: the user's, then the env suite's protocol defaults (ALFWorld's 30 turns ...)."""
    return with_suite_defaults(cfg.agent, (suite.agent_defaults if suite is not None else None), agent_fields_given(cfg))


def open_backend(config: BackendConfig) -> tuple[Any, Any]:
    """(backend, tokenizer) for ``config``; a vLLM server must answer ``/health`` now, so a
    server that died after the preflight check fails here, before any episode is played."""
    backend, tokenizer = make_backend(config)
    if config.kind == "vllm" and not backend.health():
        backend.close()
        raise BackendUnavailable(f"no vLLM server answers at {config.base_url}; start one with "
                                 f"`seed-agents serve --model {config.model}`")
    return backend, tokenizer


def open_chat_model(config: BackendConfig, sampling: SamplingParams | None = None, *, model_name: str | None = None) -> Any:
    """A ``SeedChatModel`` over ``open_backend(config)``: the policy of ``eval``, an external
    analyzer. The caller closes ``llm.backend``."""
    backend, tokenizer = open_backend(config)
    return SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=sampling or SamplingParams(),
                         model_name=model_name or config.model)
