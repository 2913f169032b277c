"""The ``EnvSuite`` base class: optional capabilities with defaults instead of ``hasattr``
probes, the three built-in suites subclass it, and a duck-typed suite still loads."""

from __future__ import annotations

from typing import Any

import pytest

from seed_agents.envs import EnvSuite, NotAnEnvSuite, as_env_suite
from seed_agents.testing import ScriptedEnv
from seed_agents.types import Task


class Minimal(EnvSuite):
    name = "minimal"

    def tasks(self, split: str, n: int) -> list[Task]:
        return [Task(task_id=f"t{i}", split=split) for i in range(n)]

    def make_env(self, task: Task) -> ScriptedEnv:
        return ScriptedEnv()

    def build_graph(self, llm: Any, **options: Any) -> Any:
        return ("graph", llm, options)


class Duck:
    """A suite written before EnvSuite was a base class: the three methods plus two hooks."""

    name = "duck"
    eval_split = "test"

    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.cache_dir = "/somewhere"

    def tasks(self, split: str, n: int) -> list[Task]:
        return [Task(task_id=f"d{i}", split=split) for i in range(n)]

    def make_env(self, task: Task) -> ScriptedEnv:
        return ScriptedEnv()

    def build_graph(self, llm: Any, **options: Any) -> Any:
        return ("duck-graph", options)

    def prepare(self, tasks: list[Task]) -> None:
        self.prepared += [t.task_id for t in tasks]


def test_optional_capabilities_have_defaults():
    suite = Minimal()
    assert (suite.eval_split, suite.agent_defaults, suite.offline_analyzer()) == ("eval_seen", None, None)
    assert suite.prepare(suite.tasks("train", 2)) is None and suite.extra_metrics({"mean_reward": 1.0}) == {}
    with pytest.raises(TypeError, match="abstract"):
        type("Incomplete", (EnvSuite,), {"name": "x", "tasks": lambda self, s, n: []})()


def test_a_duck_typed_suite_is_adapted_with_its_own_hooks_and_the_defaults_for_the_rest():
    duck = Duck()
    suite = as_env_suite(duck)
    assert isinstance(suite, EnvSuite) and suite.name == "duck" and suite.eval_split == "test"
    suite.prepare(suite.tasks("train", 2))
    assert duck.prepared == ["d0", "d1"]  # its own hook is called
    assert suite.agent_defaults is None and suite.offline_analyzer() is None and suite.extra_metrics({}) == {}
    assert suite.build_graph("llm", max_turns=3) == ("duck-graph", {"max_turns": 3})
    assert suite.cache_dir == "/somewhere"  # suite-specific attributes still reachable
    assert as_env_suite(Minimal()).__class__ is Minimal  # a subclass is used as it is


def test_an_object_that_is_no_suite_is_one_clear_error():
    with pytest.raises(NotAnEnvSuite, match=r"has no make_env, build_graph; subclass seed_agents.envs.EnvSuite"):
        as_env_suite(type("Half", (), {"tasks": lambda self, s, n: []})())


def test_builtin_suites_subclass_it_and_say_what_they_offer(tmp_path):
    from seed_agents.tools.alfworld import AlfWorldSuite
    from seed_agents.tools.alfworld_analyzer import AlfWorldAnalyzer
    from seed_agents.tools.textworld import TextWorldSuite
    from seed_agents.tools.textworld_analyzer import TextWorldAnalyzer
    from seed_agents.tools.webshop.suite import WebShopSuite

    tw, alf, shop = TextWorldSuite(cache_dir=tmp_path), AlfWorldSuite(data_dir=tmp_path), WebShopSuite()
    assert all(isinstance(s, EnvSuite) for s in (tw, alf, shop))
    assert isinstance(tw.offline_analyzer(), TextWorldAnalyzer) and isinstance(alf.offline_analyzer(), AlfWorldAnalyzer)
    assert shop.offline_analyzer() is None  # no rule-based stand-in for shopping: automatic stage 1 is off
    assert (tw.eval_split, alf.eval_split, shop.eval_split) == ("eval_seen", "valid_seen", "test")
    assert tw.agent_defaults is None and alf.agent_defaults["max_turns"] == 30
    assert shop.extra_metrics({"mean_reward": 0.25}) == {"score": 25.0} and tw.extra_metrics({"mean_reward": 1}) == {}
