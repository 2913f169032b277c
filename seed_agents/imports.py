"""Resolve ``"package.module:attribute"`` strings from configs, with one clear error.

``graphs``, ``tools`` and ``trainers`` live inside the namespace (``seed_agents.graphs``, ...),
where a user's own ``tools.py`` cannot shadow them. A config that names them as bare top-level
packages (``tools.openapi:...``, ``graphs.calculator:...``) still loads: the path is rewritten
to the namespaced one with a one-line deprecation (``RenamedConfigKey``, which the CLI prints
as one line), but only when the namespaced module exists, so a user's own
``tools.my_tools:make`` is imported as written.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from typing import TYPE_CHECKING, Any

from seed_agents.config.loading import RenamedConfigKey

if TYPE_CHECKING:
    from seed_agents.types import EpisodeReward, Task

_NAMESPACED = ("graphs", "tools", "trainers")
# Modules that left the package for the repo's examples/ (importable from a checkout).
_TO_EXAMPLES = {"tools.demo_service": "examples.library_service", "tools.knowledge_base": "examples.knowledge_base"}


def load_object(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not an import path of the form 'package.module:attribute'")
    module_name = moved_module(module_name, spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import {module_name!r} (from {spec!r}): {e}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attr!r} (from {spec!r})") from None
    return obj


def moved_module(module_name: str, spec: str | None = None) -> str:
    """``module_name``, or its namespaced name when it names one of ours as a bare top-level
    package (with a one-line deprecation warning)."""
    top, dot, _ = module_name.partition(".")
    if top not in _NAMESPACED or not dot:  # a bare `tools` is the user's own module: ours held nothing there
        return module_name
    new = _TO_EXAMPLES.get(module_name, f"seed_agents.{module_name}")
    try:
        found = importlib.util.find_spec(new) is not None
    except ImportError:  # a parent that is not a package
        found = False
    if not found:
        return module_name
    old = spec or module_name
    warnings.warn(f"{old!r} uses the old layout: write {old.replace(module_name, new, 1)!r} "
                  f"({module_name.split('.')[0]}/ now installs as seed_agents.{module_name.split('.')[0]})",
                  RenamedConfigKey, stacklevel=3)
    return new


_EPISODE_FORM = ({"task"}, {"state", "final_state"})
_SESSION_FORM = ({"session"}, {"calls"})


def reward_form(fn: Any, spec: str = "") -> str:
    """"episode" for ``fn(task, state)`` (``seed_agents.types.EpisodeReward``, the runner's and the
    loop's), "session" for ``fn(session, calls)`` (``seed_agents.types.Verifier``, the gateway's
    verifiers); a one-line ValueError for anything else."""
    import inspect

    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:2]]
    required = [p for p in params if p.default is p.empty]
    if len(names) == 2 and len(required) <= 2:
        for form, (first, second) in (("episode", _EPISODE_FORM), ("session", _SESSION_FORM)):
            if names[0] in first and names[1] in second:
                return form
    shown = getattr(fn, "__name__", type(fn).__name__)
    raise ValueError(f"reward {spec or shown!r} takes ({', '.join(p.name for p in params)}); a reward takes "
                     f"(task, state) like the loop's rewards or (session, calls) like the gateway's verifiers")


def load_reward(spec: str) -> EpisodeReward:
    """The reward at ``spec`` as ``reward(task, state) -> float``, the loop's form. A gateway
    verifier ``fn(session, calls)`` is adapted: it sees a session holding the replay's task
    as the gateway stores one (``metadata["task"]``, a dict in ``Task``'s JSON form) and the
    episode's policy calls so far (the runner scores inside the episode's capture scope); its
    None ("no opinion") scores 0. ``seed_agents.types.Verifier`` says what each input holds."""
    fn = load_object(spec)
    if reward_form(fn, spec) == "episode":
        return fn

    def episode_reward(task: Task, state: dict[str, Any]) -> float:
        import time

        from seed_agents.capture import current_scope
        from seed_agents.types import SessionRecord

        scope = current_scope()
        calls = [c for c in (scope.calls if scope is not None else []) if c.purpose == "policy"]
        now = time.time()
        session = SessionRecord(session_id=task.task_id, task_key=task.task_id, created_at=now, ended_at=now,
                                metadata={"task": task.model_dump(mode="json")}, flagged_reason=None, consumed_by=None,
                                num_calls=len(calls))
        value = fn(session, calls)
        return 0.0 if value is None else float(value)

    episode_reward.__name__ = getattr(fn, "__name__", "episode_reward")
    return episode_reward
