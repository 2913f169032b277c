"""Environments as a small protocol, found by name through entry points.

An environment suite bundles a task manifest, an environment factory and the agent graph
that plays it, plus optional capabilities (``EnvSuite``'s methods with defaults: task
preparation, extra metrics, an offline analyzer) that the core calls without probing.
Suites register under the ``seed_agents.envs`` entry-point group, so
``--env NAME`` reaches a user's own suite in another package, and the core never imports
``seed_agents.tools`` or ``seed_agents.graphs``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from seed_agents.errors import UnknownEnvError
from seed_agents.skills import Analyzer

# The structured episode an offline analyzer reads is part of the contract (types.py); named here too.
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


class EnvSuite(ABC):
    """A named benchmark: tasks, one env per episode, and the graph that plays it.

    Subclass it: ``tasks``, ``make_env`` and ``build_graph`` are required; everything else
    is an optional capability with a default that does nothing, so the core calls it
    without probing. A class that only has the three methods (duck-typed) still loads
    through ``load_env_suite`` (see ``as_env_suite``).
    """

    name: str = "env"
    #: The split ``seed-agents eval`` uses when the user names none.
    eval_split: str = "eval_seen"
    #: The protocol's agent settings (e.g. ALFWorld's 30 turns, window 5); the CLI applies
    #: them to the agent fields the user did not set. None: the agent's own defaults.
    agent_defaults: dict[str, Any] | None = None

    @abstractmethod
    def tasks(self, split: str, n: int) -> list[Task]:
        """The first ``n`` tasks of ``split``, in a fixed order with stable ids."""

    @abstractmethod
    def make_env(self, task: Task) -> TextEnv:
        """A fresh env for one episode of ``task``."""

    @abstractmethod
    def build_graph(self, llm: Any, **options: Any) -> Any:
        """A compiled LangGraph graph; its input is ``{"task": Task}`` and its config
        carries the env under ``configurable["env"]``."""

    def prepare(self, tasks: list[Task]) -> None:
        """Do slow per-task set-up (build games, load an index) before the first episode,
        and fail there when something is missing. Default: nothing to do."""

    def extra_metrics(self, summary: dict[str, Any]) -> dict[str, float]:
        """The benchmark's own figures computed from an eval ``summary`` (e.g. WebShop's
        score); merged into the eval's metrics. Default: none."""
        return {}

    def offline_analyzer(self) -> Analyzer | None:
        """A deterministic analyzer that writes skills from ``EpisodeRecord``s without a
        model (the stand-in for a stronger analyzer: tests, CI, automatic stage 1).
        None (the default): automatic stage 1 and ``skills.source: rule_based`` are off
        for this suite."""
        return None


class NotAnEnvSuite(UnknownEnvError):
    """The entry point gave an object without ``tasks``/``make_env``/``build_graph``."""


_REQUIRED = ("tasks", "make_env", "build_graph")
_OPTIONAL = ("prepare", "extra_metrics", "offline_analyzer")


class _DuckSuite(EnvSuite):
    """A suite written before ``EnvSuite`` was a base class, or without subclassing it:
    its methods are called through, and the optional ones it lacks get the defaults."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = str(getattr(inner, "name", type(inner).__name__))
        self.eval_split = getattr(inner, "eval_split", EnvSuite.eval_split)
        self.agent_defaults = getattr(inner, "agent_defaults", None)
        for hook in _OPTIONAL:  # the one place a hook is looked up by name: the boundary to untyped code
            if callable(getattr(inner, hook, None)):
                setattr(self, hook, getattr(inner, hook))

    def tasks(self, split: str, n: int) -> list[Task]:
        return self.inner.tasks(split, n)

    def make_env(self, task: Task) -> TextEnv:
        return self.inner.make_env(task)

    def build_graph(self, llm: Any, **options: Any) -> Any:
        return self.inner.build_graph(llm, **options)

    def __getattr__(self, attr: str) -> Any:  # suite-specific helpers (cache_dir, games, ...)
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)


def as_env_suite(obj: Any, what: str = "the env suite") -> EnvSuite:
    """``obj`` as an ``EnvSuite``: itself when it subclasses it, a wrapper when it only has
    the three required methods, else ``NotAnEnvSuite`` with a one-line fix."""
    if isinstance(obj, EnvSuite):
        return obj
    missing = [m for m in _REQUIRED if not callable(getattr(obj, m, None))]
    if missing:
        raise NotAnEnvSuite(f"{what} ({type(obj).__name__}) has no {', '.join(missing)}; subclass "
                            f"seed_agents.envs.EnvSuite and implement tasks, make_env and build_graph")
    return _DuckSuite(obj)


def available_envs() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def load_env_suite(name: str, **options: Any) -> EnvSuite:
    """Instantiate the suite registered as ``name`` (entry point group ``seed_agents.envs``)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return as_env_suite(ep.load()(**options), f"the env {name!r} ({ep.value})")
    installed = ", ".join(available_envs()) or "none"
    raise UnknownEnvError(
        f"no environment named {name!r}; installed: {installed}; pass one of them with --env "
        f"(or register yours under the entry-point group {ENTRY_POINT_GROUP!r})"
    )
