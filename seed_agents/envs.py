"""Environments as a small protocol, found by name through entry points.

An environment suite bundles a task manifest, an environment factory and the agent graph
that plays it. Suites register under the ``seed_agents.envs`` entry-point group, so
``--env NAME`` reaches a user's own suite in another package, and the core never imports
``tools`` or ``graphs`` statically.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from seed_agents.types import Task

ENTRY_POINT_GROUP = "seed_agents.envs"


class EnvObservation(BaseModel):
    """What the agent sees after reset or a step.

    ``reward`` is the reward of *this* step (not cumulative). ``invalid`` marks an action
    the environment did not accept; the game state did not change.
    """

    text: str
    admissible_actions: list[str] = Field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    won: bool = False
    lost: bool = False
    invalid: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class TextEnv(Protocol):
    """One episode's environment. Instances are never shared between episodes."""

    def reset(self) -> EnvObservation: ...

    def step(self, action: str) -> EnvObservation: ...

    def close(self) -> None: ...


@runtime_checkable
class EnvSuite(Protocol):
    """A named benchmark: tasks, one env per episode, and the graph that plays it."""

    name: str

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first ``n`` tasks of ``split``, in a fixed order with stable ids."""
        ...

    def make_env(self, task: Task) -> TextEnv: ...

    def build_graph(self, llm: Any, **options: Any) -> Any:
        """A compiled LangGraph graph; its input is ``{"task": Task}`` and its config
        carries the env under ``configurable["env"]``."""
        ...


class UnknownEnvError(LookupError):
    pass


def available_envs() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def load_env_suite(name: str, **options: Any) -> EnvSuite:
    """Instantiate the suite registered as ``name`` (entry point group ``seed_agents.envs``)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()(**options)
    installed = ", ".join(available_envs()) or "none"
    raise UnknownEnvError(
        f"no environment named {name!r}; installed: {installed}; pass one of them with --env "
        f"(or register yours under the entry-point group {ENTRY_POINT_GROUP!r})"
    )
